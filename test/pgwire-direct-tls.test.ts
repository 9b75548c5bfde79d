// Issue 30 item 6: a PostgreSQL 17 client with sslnegotiation=direct sends a TLS ClientHello first (ALPN
// postgresql). With a certificate the listener speaks TLS at once and the login goes on inside it; without
// one the connection is closed at once and logged as a direct TLS attempt (not as an oversized message).
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { needServer } from './helpers/servers.js';
import { startWirePool } from './helpers/pgwire.js';
import { startTestService } from './helpers/service.js';
import { pino } from 'pino';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const dir = mkdtempSync(join(tmpdir(), 'pgwire-direct-'));
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2', '-subj', '/CN=pools.localhost', '-addext', 'subjectAltName=DNS:*.pools.localhost', '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const w = await startWirePool({ maxConcurrent: 2, overrides: { wireTlsCertFile: cert, wireTlsKeyFile: key } });
  t.teardown(async () => {
    await w.close();
    rmSync(dir, { recursive: true, force: true });
  });

  t.test('direct TLS with ALPN postgresql: the login and a query run inside it', async (t) => {
    const host = `${w.sub}.pools.localhost`;
    const s = connect({ host: '127.0.0.1', port: w.port, servername: host, ca: readFileSync(cert), ALPNProtocols: ['postgresql'] });
    await new Promise<void>((resolve, reject) => s.once('secureConnect', resolve).once('error', reject));
    t.equal(s.alpnProtocol, 'postgresql', 'ALPN postgresql chosen');
    const params = Buffer.from('user\0x\0database\0x\0\0');
    const startup = Buffer.alloc(8);
    startup.writeUInt32BE(8 + params.length, 0);
    startup.writeUInt32BE(196608, 4);
    let got = Buffer.alloc(0);
    s.on('data', (c: Buffer) => (got = Buffer.concat([got, c])));
    s.write(Buffer.concat([startup, params]));
    const wait = async (f: () => boolean) => {
      const end = Date.now() + 10_000;
      while (!f() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      return f();
    };
    t.ok(await wait(() => got.length > 0 && got[0] === 0x52), 'an authentication request comes back over TLS');
    got = Buffer.alloc(0);
    const pw = Buffer.from(`${w.key}\0`);
    const msg = Buffer.alloc(5);
    msg[0] = 0x70;
    msg.writeUInt32BE(4 + pw.length, 1);
    s.write(Buffer.concat([msg, pw]));
    t.ok(await wait(() => got.includes(Buffer.from([0x5a, 0, 0, 0, 5]))), 'logged in: ReadyForQuery');
    s.destroy();
  });

  t.test('a listener without a certificate closes a direct TLS client at once, logged as what it is', async (t) => {
    const lines: Array<Record<string, any>> = [];
    const log = pino({ level: 'debug' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, any>) });
    const bare = await startTestService({ overrides: { dbAllowInsecure: true, accessLogFile: '/dev/null' }, log });
    t.teardown(() => bare.close());
    const started = Date.now();
    const s = connect({ host: '127.0.0.1', port: bare.service.ports.pg!, servername: 'x.pools.localhost', rejectUnauthorized: false, ALPNProtocols: ['postgresql'] });
    const outcome = await new Promise<string>((resolve) => {
      s.once('secureConnect', () => resolve('handshake completed'));
      s.once('error', (e: NodeJS.ErrnoException) => resolve(`error ${e.code ?? e.message}`));
      s.once('close', () => resolve('closed'));
    });
    s.destroy();
    t.match(outcome, /^(error|closed)/, `the TLS client sees the connection end (${outcome})`);
    t.ok(Date.now() - started < 5_000, 'at once, not after a login timeout');
    const refused = lines.find((l) => l.event === 'pgwire' && l.outcome === 'login refused');
    t.match(refused?.msg, /direct TLS negotiation \(sslnegotiation=direct\), but the listener has no certificate/, 'one clear line says why');
    t.notOk(lines.some((l) => /bytes exceeds the limit/.test(l.msg)), 'not "message of 369295617 bytes exceeds the limit"');
  });
}
