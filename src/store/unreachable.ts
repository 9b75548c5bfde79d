// Whether an error means the PostgreSQL store cannot be reached right now (down, restarting, failing over),
// rather than a fault in the request or in poolgate: the Control API answers those 503 with Retry-After, and
// the pg pool reconnects by itself once the server is back.
const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH']);

export function isStoreUnreachable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string') {
    if (CONNECTION_CODES.has(code)) return true;
    // SQLSTATE class 08 (connection exception) and 57P01–57P03 (admin shutdown, crash shutdown, cannot
    // connect now: a server starting up or in recovery).
    if (code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03') return true;
  }
  return /^Connection terminated|^timeout exceeded when trying to connect|Client has encountered a connection error/.test(err.message);
}
