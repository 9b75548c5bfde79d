// Logins and bad input on the PostgreSQL wire listener: every refusal is a clean ErrorResponse with its
// SQLSTATE (docs/pgwire.md), garbage and oversized frames end only that connection, and nothing
// is left held. Also: wire transactions are counted in the pool's metrics.
import t from 'tap';
import { connect } from 'node:net';
import pg from 'pg';
import { needServer } from './helpers/servers.js';
import { assertNothingHeld, runTool, startWirePool, type WirePool } from './helpers/pgwire.js';

const skip = await needServer('postgres');
if (skip) {
  t.skip(skip);
} else {
  const w: WirePool = await startWirePool({ maxConcurrent: 2 });
  t.teardown(() => w.close());
  const refusal = async (extra: Partial<pg.ClientConfig>) => {
    const c = new pg.Client(w.clientConfig(extra));
    c.on('error', () => {});
    return c.connect().then(
      async () => {
        await c.end();
        return null;
      },
      (e: { code?: string; message: string }) => e,
    );
  };
  /**
   * Sends raw bytes and collects what comes back until the listener closes the connection, or until `enough`
   * holds for what came back (then the client closes it), or `ms` pass.
   */
  const raw = (bytes: Buffer[], ms = 15_000, enough?: (out: Buffer) => boolean) =>
    new Promise<{ out: Buffer; closed: boolean }>((resolve) => {
      const s = connect({ host: '127.0.0.1', port: w.port });
      const chunks: Buffer[] = [];
      const timer = setTimeout(() => {
        s.destroy();
        resolve({ out: Buffer.concat(chunks), closed: false });
      }, ms);
      s.on('data', (c) => {
        chunks.push(c);
        const out = Buffer.concat(chunks);
        if (enough?.(out)) {
          clearTimeout(timer);
          s.destroy();
          resolve({ out, closed: false });
        }
      });
      s.on('error', () => {});
      s.on('close', () => {
        clearTimeout(timer);
        resolve({ out: Buffer.concat(chunks), closed: true });
      });
      s.on('connect', () => bytes.forEach((b) => s.write(b)));
    });
  const startup = (params: Record<string, string>) => {
    const body = Buffer.concat([...Object.entries(params).map(([k, v]) => Buffer.from(`${k}\0${v}\0`)), Buffer.from([0])]);
    const head = Buffer.alloc(8);
    head.writeInt32BE(8 + body.length, 0);
    head.writeInt32BE(196608, 4);
    return Buffer.concat([head, body]);
  };
  const sqlstate = (out: Buffer) => /\0C([0-9A-Z]{5})\0/.exec(out.toString('latin1'))?.[1] ?? null;

  t.test('refused logins: each with its SQLSTATE', async (t) => {
    const read = await w.svc.api('POST', `/api/v1/pools/${w.sub}/keys`, { token: w.token, body: { label: 'r', access: 'read' } });
    await w.svc.service.dataplane!.snapshots.reload();
    t.equal((await refusal({ password: read.body.data.key }))?.code, '28000', 'a read key');
    t.equal((await refusal({ options: `pool=${w.sub} -X` }))?.code, '0A000', 'an options word that is neither pool= nor a setting is refused');
    t.equal((await refusal({ replication: 'database' } as Partial<pg.ClientConfig>))?.code, '0A000', 'replication connections are refused');
    t.equal((await refusal({ password: '' }))?.code, '28P01', 'an empty password');
    const noUser = await raw([startup({ database: 'x' })]);
    t.equal(sqlstate(noUser.out), '08004', 'no SNI, no options, no user: no pool named');
    t.match(noUser.out.toString('latin1'), /no pool named: log in as user=<subdomain>/);
    const r = await runTool('psql', ['-X', '-At', w.conninfo({ sslmode: 'require' }), '-c', 'SELECT 1']);
    t.not(r.code, 0, 'sslmode=require fails when no certificate is configured');
    t.match(r.stderr, /does not support SSL/);
    const p = await runTool('psql', ['-X', '-At', w.conninfo({ sslmode: 'prefer' }), '-c', 'SELECT 1']);
    t.equal(p.stdout.trim(), '1', 'sslmode=prefer goes on in plaintext');
  });

  t.test('policies: the IP allowlist applies; request-shaped policies refuse wire connections', async (t) => {
    await w.patch({ settings: { ipAllowlist: ['10.0.0.0/8'] } });
    t.equal((await refusal({}))?.code, '28000', 'an address outside the allowlist');
    await w.patch({ settings: { ipAllowlist: ['127.0.0.0/8', '::1/128'] } });
    t.equal(await refusal({}), null, 'an address inside it');
    await w.patch({ settings: { ipAllowlist: null, originSigning: true } });
    const e = await refusal({});
    t.equal(e?.code, '28000');
    t.match(e?.message, /HMAC request signing/);
    await w.patch({ settings: { originSigning: null } });
    // A connected client whose pool becomes off-limits is refused at its next transaction.
    const c = new pg.Client(w.clientConfig());
    c.on('error', () => {});
    await c.connect();
    await c.query('SELECT 1');
    await w.patch({ settings: { ipAllowlist: ['10.0.0.0/8'] } });
    const late = await c.query('SELECT 1').then(() => null, (x: { code?: string }) => x);
    t.ok(late, 'the next transaction is refused');
    await w.patch({ settings: { ipAllowlist: null } });
  });

  t.test('garbage, truncated and oversized frames end only their own connection', async (t) => {
    const garbage = await raw([Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n')]);
    t.ok(garbage.closed, 'an HTTP request is answered and closed');
    t.equal(sqlstate(garbage.out), '08P01');
    const huge = Buffer.alloc(8);
    huge.writeInt32BE(1 << 30, 0);
    huge.writeInt32BE(196608, 4);
    const big = await raw([huge]);
    t.equal(sqlstate(big.out), '08P01', 'a startup packet claiming 1 GiB is refused before anything is buffered');
    const gss = Buffer.alloc(8);
    gss.writeInt32BE(8, 0);
    gss.writeInt32BE(80877104, 4);
    // The listener then waits for the password: the client stops reading once the password request is in.
    const g = await raw([gss, startup({ user: 'x', options: `pool=${w.sub}` })], 15_000, (out) => out.length >= 2);
    t.equal(g.out[0], 0x4e, 'GSSENCRequest is answered N');
    t.equal(g.out[1], 0x52, 'and the startup that follows is served (asks for the password)');
    const pw = Buffer.from(`p\0\0\0\0${w.key}\0`);
    pw.writeInt32BE(pw.length - 1, 1);
    const bigQuery = Buffer.alloc(5);
    bigQuery[0] = 0x51;
    bigQuery.writeInt32BE(17 * 1024 * 1024, 1);
    const o = await raw([startup({ user: 'x', options: `pool=${w.sub}` }), pw, bigQuery]);
    t.match(o.out.toString('latin1'), /Z\0\0\0\x05I/, 'logged in');
    t.equal(sqlstate(o.out), '08P01', 'a 17 MiB message after login is refused');
    t.match(o.out.toString('latin1'), /exceeds the limit/);
    t.ok(o.closed);
    const truncated = await raw([startup({ user: 'x', options: `pool=${w.sub}` }), pw, Buffer.from([0x51, 0, 0, 0, 50, 0x53])], 1000);
    t.notOk(truncated.closed, 'a truncated frame just waits for the rest (closed by the client here)');
    const c = new pg.Client(w.clientConfig());
    await c.connect();
    t.equal((await c.query('SELECT 1 AS n')).rows[0].n, 1, 'the listener still serves');
    await c.end();
  });

  t.test('wire transactions are counted as pool requests', async (t) => {
    const c = new pg.Client(w.clientConfig());
    await c.connect();
    for (let i = 0; i < 5; i++) await c.query('SELECT 1');
    await c.end();
    const text = await (await fetch(`${w.svc.metricsUrl}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith('poolgate_pool_admitted_total') && l.includes(`"${w.sub}"`));
    t.ok(line, 'the pool has an admitted counter');
    t.ok(Number(line!.split(' ').pop()) >= 5, `at least the 5 transactions: ${line}`);
  });

  t.test('a Query pipelined with the start of an extended batch keeps the link until that batch is synced', async (t) => {
    // The fuzz's intermittent "first BEGIN never answered": a client sent a simple Query and, in the same
    // chunk, an extended-protocol message without its Sync. The Query's ReadyForQuery 'I' unlinked the
    // server connection with that message already forwarded; PostgreSQL, after an error in it, skips
    // everything until a Sync, so the next client handed that idle connection had its BEGIN swallowed.
    const frame = (type: string, body: Buffer) => {
      const head = Buffer.alloc(5);
      head.write(type, 0, 'latin1');
      head.writeInt32BE(4 + body.length, 1);
      return Buffer.concat([head, body]);
    };
    const q = (sql: string) => frame('Q', Buffer.from(`${sql}\0`));
    const parse = (sql: string) => frame('P', Buffer.from(`\0${sql}\0\0\0`));
    const sync = frame('S', Buffer.alloc(0));
    const pw = Buffer.from(`p\0\0\0\0${w.key}\0`);
    pw.writeInt32BE(pw.length - 1, 1);
    const s = connect({ host: '127.0.0.1', port: w.port });
    s.on('error', () => {});
    let out = Buffer.alloc(0);
    s.on('data', (c: Buffer) => (out = Buffer.concat([out, c])));
    /** Waits (at most 5 s) until the output after `from` holds `n` ReadyForQuery messages; returns that output. */
    const readies = async (from: number, n: number) => {
      const end = Date.now() + 5000;
      const count = () => out.subarray(from).toString('latin1').split('Z\0\0\0\x05').length - 1;
      while (count() < n && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
      return out.subarray(from).toString('latin1');
    };
    await new Promise<void>((r) => s.once('connect', () => r()));
    s.write(Buffer.concat([startup({ user: 'x', options: `pool=${w.sub}` }), pw]));
    t.match(await readies(0, 1), /Z\0\0\0\x05I$/, 'logged in');
    // One write: a Query, then a Parse that fails upstream, its Sync left for later.
    let from = out.length;
    s.write(Buffer.concat([q('SELECT 1'), parse('SELEC 2')]));
    t.match(await readies(from, 1), /C\0\0\0\x0dSELECT 1\0Z\0\0\0\x05I/, 'the Query is answered');
    await new Promise((r) => setTimeout(r, 100));
    s.write(sync);
    const batch = await readies(from, 2);
    t.match(batch, /Z\0\0\0\x05I$/, 'the Sync is answered');
    t.equal(sqlstate(Buffer.from(batch, 'latin1')), '42601', "the Parse's error reaches the client (the batch ran while it was still linked)");
    for (let i = 0; i < 4; i++) {
      from = out.length;
      s.write(q(`SELECT ${i}`));
      t.match(await readies(from, 1), /C\0\0\0\x0dSELECT 1\0Z\0\0\0\x05I$/, `the next Query ${i} is answered`);
    }
    s.end();
    await new Promise((r) => s.once('close', r));
  });

  t.test('nothing is left held', (t) => assertNothingHeld(t, w));
}
