// The MySQL listener offers TLS when wireTlsCertFile/wireTlsKeyFile are set: mysql2 and the mariadb CLI
// upgrade with an SSLRequest and log in with the pool key over it. Without them, CLIENT_SSL is not offered.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { needServer } from './helpers/servers.js';
import { mariadbCli, wirePool } from './helpers/mysql-wire.js';

const skip = await needServer('mariadb');
if (skip) {
  t.skip(skip);
} else {
  const dir = mkdtempSync(join(tmpdir(), 'mysqlwire-tls-'));
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost', '-days', '1', '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const w = await wirePool(t, { overrides: { wireTlsCertFile: cert, wireTlsKeyFile: key } });

  t.test('mysql2 over TLS', async (t) => {
    const c = await w.connect({ ssl: { rejectUnauthorized: false } });
    const stream = (c as unknown as { connection: { stream: { encrypted?: boolean } } }).connection.stream;
    t.equal(stream.encrypted, true, 'the client socket is TLS');
    t.same((await c.query('SELECT 8 AS eight'))[0], [{ eight: 8 }]);
    t.same((await c.execute('SELECT ? AS v', ['tls']))[0], [{ v: 'tls' }]);
    await c.end();
  });

  t.test('the mariadb CLI over TLS', async (t) => {
    const r = await mariadbCli(['-h', '127.0.0.1', '-P', String(w.port), '-u', w.sub, `-p${w.key}`, '--ssl', '--skip-ssl-verify-server-cert', '-e', 'status']);
    t.equal(r.code, 0, r.stderr);
    t.match(r.stdout, /SSL:\s+Cipher in use is/);
  });

  t.test('without a certificate the listener does not offer TLS', async (t) => {
    const plain = await wirePool(t);
    await t.rejects(plain.connect({ ssl: { rejectUnauthorized: false } }), { code: 'HANDSHAKE_NO_SSL_SUPPORT' }, 'a client that insists on TLS is refused');
    const c = await plain.connect();
    t.same((await c.query('SELECT 1 AS one'))[0], [{ one: 1 }]);
    await c.end();
  });
}
