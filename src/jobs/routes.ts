// Job polling routes on a uWS listener (the lock/pool API host): registerJobRoutes adds
// /pools/:pool/jobs/:id and /pools/:pool/jobs/:id/result beside whatever else the listener serves.
import type { HttpRequest, HttpResponse, TemplatedApp } from 'uWebSockets.js';
import { ClientResponse } from '../pool-request/client-response.js';
import { readRequestHeaders } from '../pool-request/exchange.js';
import type { Logger } from '../log.js';
import { answerJobPoll, matchJobRoute, type JobPollDeps, type JobRoute, type PollAnswer, type PollRequest } from './poll.js';

export interface JobRouteDeps extends JobPollDeps {
  log: Logger;
}

/** Writes a poll answer (a stored result can be megabytes: the rest goes out as the socket drains). */
export function sendPollAnswer(client: ClientResponse, head: boolean, a: PollAnswer): void {
  if (!client.open || client.started) return;
  client.writeHead(a.status, a.headers);
  if (head) {
    client.endWithoutBody(a.length ?? a.body.length);
    return;
  }
  const start = client.writeOffset();
  const [ok, done] = client.tryEnd(a.body, a.body.length);
  if (ok || done) return;
  client.onWritable((offset) => client.tryEnd(a.body.subarray(offset - start), a.body.length)[0]);
}

/** Answers a poll request already read from uWS; resolves when the answer was written. */
export async function servePoll(deps: JobRouteDeps, client: ClientResponse, route: JobRoute, req: PollRequest): Promise<void> {
  let answer: PollAnswer;
  try {
    answer = await answerJobPoll(deps, route, req);
  } catch (err) {
    deps.log.error({ err }, 'job poll failed');
    answer = { status: 503, headers: [['content-type', 'application/json']], body: Buffer.from('{"error":"unavailable","message":"the job store is unavailable; retry later"}') };
  }
  sendPollAnswer(client, req.method === 'HEAD', answer);
}

/** Reads what a poll needs from a uWS request (valid only synchronously inside the handler). */
export function readPollRequest(res: HttpResponse, req: HttpRequest): PollRequest {
  const headers = readRequestHeaders(req);
  return {
    method: req.getCaseSensitiveMethod(),
    path: req.getUrl(),
    headers,
    clientAddress: Buffer.from(res.getRemoteAddressAsText()).toString(),
  };
}

/** Registers the two job routes on a uWS app (more specific than its `/*` handler, so they win). */
export function registerJobRoutes(app: TemplatedApp, deps: JobRouteDeps): void {
  const handler = (res: HttpResponse, req: HttpRequest) => {
    const r = readPollRequest(res, req);
    const client = new ClientResponse(res, r.method === 'HEAD');
    const route = matchJobRoute(r.path);
    if (!route) {
      sendPollAnswer(client, r.method === 'HEAD', { status: 404, headers: [['content-type', 'application/json']], body: Buffer.from('{"error":"not_found","message":"no such route"}') });
      return;
    }
    void servePoll(deps, client, route, r);
  };
  app.any('/pools/:pool/jobs/:id', handler);
  app.any('/pools/:pool/jobs/:id/result', handler);
}
