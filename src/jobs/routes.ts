// Job polling on the lock API's listener (the lock/pool API host): /pools/{pool}/jobs/{id} and
// /pools/{pool}/jobs/{id}/result, beside the lock routes (src/lock/server.ts routes a request here first).
import type { IncomingMessage } from 'node:http';
import type { ResponseEncoder } from '../pool-request/codec.js';
import { peerAddress } from '../pool-request/exchange.js';
import { readNodeHeaders } from '../pool-request/node-http.js';
import type { Logger } from '../log.js';
import { answerJobPoll, type JobPollDeps, type JobRoute, type PollAnswer, type PollRequest } from './poll.js';

export interface JobRouteDeps extends JobPollDeps {
  log: Logger;
}

/** Writes a poll answer (a stored result can be megabytes: the rest goes out as the socket drains). */
export function sendPollAnswer(client: ResponseEncoder, head: boolean, a: PollAnswer): void {
  if (!client.open || client.started) return;
  client.encodeHeaders(a.status, a.headers, a.body.length);
  if (head) client.endWithoutBody(a.length ?? a.body.length);
  else client.encodeData(a.body, true);
}

/** Answers a poll request; resolves when the answer was written. */
export async function servePoll(deps: JobRouteDeps, client: ResponseEncoder, route: JobRoute, req: PollRequest): Promise<void> {
  let answer: PollAnswer;
  try {
    answer = await answerJobPoll(deps, route, req);
  } catch (err) {
    deps.log.error({ err }, 'job poll failed');
    answer = { status: 503, headers: [['content-type', 'application/json']], body: Buffer.from('{"error":"unavailable","message":"the job store is unavailable; retry later"}') };
  }
  sendPollAnswer(client, req.method === 'HEAD', answer);
}

/** What a poll needs from a node:http request (the path without its query). */
export function readPollRequest(req: IncomingMessage, path: string): PollRequest {
  return {
    method: req.method ?? 'GET',
    path,
    headers: readNodeHeaders(req.rawHeaders),
    clientAddress: peerAddress(req.socket.remoteAddress),
  };
}
