// What a bug or an unexpected failure on the request path costs: this one request, never the process or a slot.
import type { Logger } from '../log.js';
import type { ResponseEncoder } from './codec.js';
import { reply } from './exchange.js';
import type { Settlement } from './release.js';

const INTERNAL_ERROR = reply(500, 'internal_error', 'internal error');
const FAILED: Settlement = { outcome: 'internal_error', status: 500 };

/**
 * Logs the failure, answers 500 and closes the connection (nothing is written when the client has gone or an
 * answer already started), and settles the request, so its slot comes back and it is counted once.
 */
export function requestFailed(log: Logger, what: string, err: unknown, client: ResponseEncoder, settle: (s: Settlement) => void): void {
  log.error({ err }, what);
  client.sendReply(INTERNAL_ERROR, null, true);
  settle(FAILED);
}
