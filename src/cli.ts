// poolgate start | control | dataplane | worker | admin …
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { loadConfig } from './config/load.js';
import { redisTarget } from './config/redis-target.js';
import type { Config } from './config/schema.js';
import type { RoleName } from './service.js';
import type { AdminDeps, AdminResult } from './admin/command.js';
import { forwardAdmin } from './admin/socket.js';
import { dataDirOwner } from './store/data-dir-lock.js';
import { version } from './version.js';
// The service, the store engine and the demo origin are imported where they are used: `--help`, an admin
// command's help or a mistake in its options, or an `admin` command forwarded to a running process, then load
// none of them (the whole graph cost ~1.3 s of CPU per invocation, opening the embedded store seconds more).

const USAGE = `poolgate: a concurrency gateway in front of https origins and PostgreSQL/MySQL databases.

usage: poolgate <command>
  start       every role in one process (embedded PGlite store in POOLGATE_DATA_DIR unless DATABASE_URL)
  control     the Control API only            (needs DATABASE_URL)
  dataplane   pool traffic, lock API, metrics (needs DATABASE_URL)
  worker      async jobs and webhook deliveries (needs DATABASE_URL)
  admin …     operator commands: poolgate admin --help
  demo-origin a local https origin for trying poolgate without internet: demo-origin [--port 8443] [--host H] [--dir D]
  --version   the installed version

Configuration comes from config files and environment variables (docs/configuration.md), not from flags.
First steps: \`poolgate start\`, then \`poolgate admin bootstrap --team NAME --email EMAIL\` for a team and an API token
(README.md: "First pool, first request").`;

const DEMO_ORIGIN_USAGE = `usage: poolgate demo-origin [--port 8443] [--host 127.0.0.1] [--dir ./data/demo-origin]
  A local https origin that answers every request with a JSON echo (and accepts webhook deliveries), over TLS with a
  self-signed certificate made once in --dir (its cert.pem is the CA file to give poolgate). For trying poolgate only.`;

export { version };

const ROLES: Record<string, RoleName[]> = {
  start: ['control', 'dataplane', 'worker'],
  control: ['control'],
  dataplane: ['dataplane'],
  worker: ['worker'],
};

async function serve(config: Config, roles: RoleName[]): Promise<void> {
  const { startService } = await import('./service.js');
  const service = await startService({ config, roles });
  process.stdout.write(JSON.stringify({ event: 'listening', ...service.ports, roles, store: service.sql.engine }) + '\n');
  // The start-up summary an operator reads first: what runs, where, on what.
  service.log.info(
    {
      event: 'started', version: version(), roles, ports: service.ports, store: service.sql.engine,
      governor: redisTarget(config) ? 'redis' : (service.dataplaneThreads ? 'shared-memory' : 'memory'),
      poolDomain: config.poolDomain, dataDir: config.databaseUrl ? undefined : resolve(config.dataDir),
    },
    `poolgate ${version()} started: ${roles.join(', ')}; store ${service.sql.engine}; pools at *.${config.poolDomain}`,
  );
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    service.log.info({ event: 'stopping', signal }, `${signal}: not ready any more; draining in-flight work`);
    const started = Date.now();
    const force = setTimeout(() => {
      process.stderr.write('poolgate: shutdown did not finish within 30 s; exiting\n');
      process.exit(1);
    }, 30_000);
    force.unref();
    void service.close().then(
      () => {
        service.log.info({ event: 'stopped', ms: Date.now() - started }, 'shutdown complete');
        service.log.flush(() => process.exit(0));
      },
      (err: unknown) => {
        process.stderr.write(`poolgate: shutdown failed: ${String(err)}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

async function admin(config: Config, argv: string[]): Promise<number> {
  const { parseAdmin, runParsedAdmin } = await import('./admin/commands.js');
  // Help and command-line mistakes are answered here, without a running process or a store.
  const inv = parseAdmin(argv);
  // Only bootstrap may create a store (and its key); every other command works on one that exists.
  const result = 'answer' in inv ? inv.answer : await adminCommand(config, argv, inv.name === 'bootstrap', (deps) => runParsedAdmin(inv, deps));
  if (!result) return 1;
  process.stdout.write(result.stdout);
  process.stderr.write(result.stderr);
  return result.code;
}

/** Forwards the command to the process holding the data dir, or runs it on the store itself; null: neither can. */
async function adminCommand(config: Config, argv: string[], create: boolean, run: (deps: AdminDeps) => Promise<AdminResult>): Promise<AdminResult | null> {
  const dataDir = resolve(config.dataDir);
  const forwarded = config.databaseUrl ? null : await forwardAdmin(dataDir, argv);
  if (forwarded) return forwarded;
  if (!config.databaseUrl && dataDirOwner(dataDir) !== null) {
    process.stderr.write(`poolgate admin: the process holding ${dataDir} does not answer on its admin socket\n`);
    return null;
  }
  const [{ openStore }, { loadMasterKey, SecretBox }] = await Promise.all([import('./store/open.js'), import('./security/secret-box.js')]);
  let sql;
  let box;
  try {
    sql = await openStore(config, { create });
    box = new SecretBox(loadMasterKey(config.secretKey, config.dataDir, { create }));
  } catch (err) {
    await sql?.close();
    const name = (err as Error).name;
    if (name !== 'StoreNotFoundError' && name !== 'MasterKeyNotFoundError') throw err;
    return { code: 1, stdout: '', stderr: `poolgate admin: ${(err as Error).message}; nothing was created.\n${whereTheStoreIs(config)}\n` };
  }
  try {
    return await run({ config, sql, box, now: () => new Date() });
  } finally {
    await sql.close();
  }
}

/** How an admin command is pointed at the store poolgate runs on, said with the values it used. */
function whereTheStoreIs(config: Config): string {
  const how = config.databaseUrl
    ? '  The store is the PostgreSQL database at DATABASE_URL; check it names the one poolgate runs on.'
    : `  The data dir is POOLGATE_DATA_DIR (${JSON.stringify(process.env.POOLGATE_DATA_DIR ?? config.dataDir)}, here ${resolve(config.dataDir)}; ` +
      `a relative one is taken from the current directory, ${process.cwd()}).\n` +
      '  Run the command where poolgate runs, or set POOLGATE_DATA_DIR=/path/to/its/data (DATABASE_URL for a PostgreSQL store).';
  const key = config.secretKey ? '' : '\n  The master key is POOLGATE_SECRET_KEY, or secret.key in the data dir.';
  return `${how}${key}\n  \`poolgate admin bootstrap\` creates a new store.`;
}

async function demoOrigin(config: Config, argv: string[]): Promise<void> {
  const { DemoOriginError, startDemoOrigin } = await import('./demo-origin.js');
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(DEMO_ORIGIN_USAGE + '\n');
    return;
  }
  const { values } = parseArgs({ args: argv, strict: true, allowPositionals: false, options: { port: { type: 'string' }, host: { type: 'string' }, dir: { type: 'string' } } });
  const port = values.port === undefined ? 8443 : Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new DemoOriginError('--port must be an integer from 0 to 65535');
  const origin = await startDemoOrigin({ host: values.host ?? '127.0.0.1', port, dir: values.dir ?? join(config.dataDir, 'demo-origin') });
  process.stdout.write(JSON.stringify({ event: 'listening', url: origin.url, caFile: origin.caFile }) + '\n');
  process.stderr.write(
    `poolgate demo origin at ${origin.url}. Start poolgate trusting its certificate (for pool traffic and webhook\n` +
    `deliveries) and allowing loopback targets and local databases without TLS:\n` +
    `  POOLGATE_ALLOW_PRIVATE_TARGETS=true POOLGATE_DB_ALLOW_INSECURE=true \\\n` +
    `    POOLGATE_ORIGIN_CA_FILE=${origin.caFile} POOLGATE_WEBHOOK_CA_FILE=${origin.caFile} npm start\n`,
  );
  const stop = () => void origin.close().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

export async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (!command) {
    // No command is a mistake, not a request for help: say what poolgate can do, and exit non-zero (as git does).
    process.stderr.write(USAGE + '\n');
    process.exitCode = 2;
    return;
  }
  if (command === '--help' || command === '-h' || command === 'help') {
    process.stdout.write(USAGE + '\n');
    return;
  }
  if (command === '--version' || command === '-v' || command === 'version') {
    process.stdout.write(version() + '\n');
    return;
  }
  try {
    const config = loadConfig();
    if (command === 'admin') {
      process.exitCode = await admin(config, rest);
      return;
    }
    if (command === 'demo-origin') {
      await demoOrigin(config, rest);
      return;
    }
    const roles = ROLES[command];
    if (!roles) {
      process.stderr.write(`unknown command: ${command}\n${USAGE}\n`);
      process.exitCode = 2;
      return;
    }
    if (rest.length > 0) {
      // Flags are not configuration: `start --port 1` must not start on the default port as if it had worked.
      process.stderr.write(`poolgate ${command} takes no arguments (got ${rest.join(' ')}): configure it with environment variables or POOLGATE_CONFIG, e.g. POOLGATE_PROXY_PORT=8080 (docs/configuration.md)\n`);
      process.exitCode = 2;
      return;
    }
    await serve(config, roles);
  } catch (err) {
    if ((err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`poolgate ${command}: ${(err as Error).message}\n${command === 'demo-origin' ? DEMO_ORIGIN_USAGE : USAGE}\n`);
      process.exit(2);
    }
    process.stderr.write(`poolgate: ${(err as Error).message}\n`);
    process.exit(1);
  }
}
