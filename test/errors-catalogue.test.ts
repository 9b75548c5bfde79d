// The one error catalogue (src/errors/catalogue.ts): docs/errors.md is what the generator makes from it, every
// error code the source answers with is in it, the boundaries accept nothing else (by type), and the wire values
// clients depend on (the spec's lock API codes, the listeners' SQLSTATEs and errnos) are what they were.
import t from 'tap';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import ts from 'typescript';
import { ERRORS, errorCodes, httpStatus, type ErrorEntry } from '../src/errors/catalogue.js';
import { SQLSTATE } from '../src/db/pgwire/errors.js';
import { WIRE_ERROR } from '../src/db/mysqlwire/wire-errors.js';
import { DOCS_PATH, renderDocs, root } from '../scripts/gen-errors-doc.js';

t.test('committed docs/errors.md is what the generator makes now', async (t) => {
  t.equal(readFileSync(DOCS_PATH, 'utf8'), renderDocs(), 'docs/errors.md is stale: run npm run docs:errors');
  for (const code of errorCodes) t.match(renderDocs(), `| \`${code}\` |`, `${code} has a row`);
});

t.test('every entry is well-formed and says where it travels', async (t) => {
  t.ok(errorCodes.length >= 25, `the catalogue has ${errorCodes.length} codes`);
  for (const code of errorCodes) {
    const e: ErrorEntry = ERRORS[code];
    t.match(code, /^[a-z]+(_[a-z]+)*$/, `${code}: snake_case`);
    t.ok(e.http || e.pg || e.mysql, `${code}: travels on at least one wire`);
    t.ok(e.message.length > 0 && e.when.length > 0, `${code}: message and when`);
    if (e.http) {
      for (const s of [e.http.status, ...(e.http.also ?? [])]) t.ok(s >= 400 && s <= 599, `${code}: HTTP ${s} is an error status`);
    }
    if (e.pg) t.match(e.pg, /^[0-9A-Z]{5}$/, `${code}: SQLSTATE`);
    if (e.mysql) {
      t.match(e.mysql.sqlstate, /^[0-9A-Z]{5}$/, `${code}: MySQL SQLSTATE`);
      // 2000–2999 are the client library's own (CR_*): libmariadb shows a server ERR carrying one as "malformed packet".
      t.ok(e.mysql.errno >= 1000 && (e.mysql.errno < 2000 || e.mysql.errno >= 3000), `${code}: server errno ${e.mysql.errno}`);
    }
  }
});

t.test("the spec's Lock API codes and statuses are in the catalogue as the spec names them", async (t) => {
  const spec: Array<[string, number]> = [
    ['unauthorized', 401],
    ['unauthorized', 403],
    ['payload_too_large', 413],
    ['too_many_requests', 429],
    ['queue_timeout', 504],
    ['not_found', 404],
    ['capped', 409],
  ];
  for (const [code, status] of spec) {
    const e = (ERRORS as Record<string, ErrorEntry>)[code];
    t.ok(e?.http && [e.http.status, ...(e.http.also ?? [])].includes(status), `${code} ${status}`);
  }
  // Control API (spec: Errors): 401, 403, 404, 422, 503 by the codes ApiError uses.
  t.same(
    (['unauthorized', 'forbidden', 'not_found', 'unprocessable', 'unavailable'] as const).map((c) => httpStatus(c)),
    [401, 403, 404, 422, 503],
  );
});

t.test('the wire listeners answer with the SQLSTATEs and errnos they always did', async (t) => {
  t.same(SQLSTATE, {
    protocolViolation: '08P01',
    rejectedEstablishment: '08004',
    unknownPool: '3D000',
    invalidPassword: '28P01',
    invalidAuthorization: '28000',
    tooManyConnections: '53300',
    rateLimited: '53400',
    cannotConnectNow: '57P03',
    upstreamUnavailable: '08001',
    upstreamLost: '08006',
    internalError: 'XX000',
    featureNotSupported: '0A000',
  });
  t.same(WIRE_ERROR, {
    accessDenied: [1045, '28000'],
    dbAccessDenied: [1044, '42000'],
    hostNotAllowed: [1130, 'HY000'],
    badHandshake: [1043, '08S01'],
    packetTooLarge: [1153, '08S01'],
    packetsOutOfOrder: [1156, '08S01'],
    unknownCommand: [1047, '08S01'],
    notSupported: [1235, '42000'],
    unknownStatement: [1243, 'HY000'],
    unknownThread: [1094, 'HY000'],
    tooBusy: [1040, '08004'],
    rateLimited: [1226, '42000'],
    unavailable: [1053, '08S01'],
    cannotConnect: [1429, 'HY000'],
    lostConnection: [1317, '70100'],
    idleInTransaction: [4031, 'HY000'],
  });
});

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : [];
  });
}

t.test('every error code the source answers with is in the catalogue', async (t) => {
  // The shapes an HTTP error code is written in: reply(status, 'code', …), sendError(…, status, 'code', …),
  // error(status, 'code', …) / stop(status, 'code', …), { error: 'code' }, ApiError('code', …), errorBody('code', …),
  // httpStatus('code').
  const patterns = [
    /\b(?:reply|stop|error|sendError\([^,]+,[^,]+,)\s*\(?\s*\d{3},\s*'([a-z_]+)'/g,
    /\berror: '([a-z_]+)'/g,
    /\b(?:ApiError|errorBody|httpStatus|pgState|mysqlError)\('([a-z_]+)'/g,
  ];
  const known = new Set<string>(errorCodes);
  const found = new Map<string, string>();
  for (const file of sourceFiles(join(root, 'src'))) {
    if (file.endsWith(join('errors', 'catalogue.ts'))) continue;
    const text = readFileSync(file, 'utf8');
    for (const re of patterns) {
      for (const m of text.matchAll(re)) if (!found.has(m[1]!)) found.set(m[1]!, relative(root, file));
    }
  }
  t.ok(found.size >= 20, `the scan sees the codes in use (${found.size})`);
  for (const [code, file] of found) t.ok(known.has(code), `${code} (${file}) is in the catalogue`);
});

t.test('the HTTP boundaries accept only catalogue codes, and reply() only their statuses (type check)', async (t) => {
  const fixture = join(root, 'test', 'fixtures', 'errors-catalogue', 'reply-types.ts');
  const config = ts.getParsedCommandLineOfConfigFile(join(root, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} })!;
  const program = ts.createProgram([fixture], { ...config.options, noEmit: true, declaration: false });
  const diagnostics = ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file ? `${relative(root, d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}` : '';
    return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, ' ')}`;
  });
  // An unused @ts-expect-error is itself an error (TS2578): a boundary that took any string would fail here.
  t.same(diagnostics, [], 'every refused call is a type error, every fine call type-checks');
});
