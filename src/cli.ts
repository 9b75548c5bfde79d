// poolgate start | control | dataplane | worker | admin …
import { resolve } from 'node:path';
import { loadConfig, ConfigError } from './config/load.js';
import type { Config } from './config/schema.js';
import { startService, type RoleName } from './service.js';
import { runAdmin } from './admin/commands.js';
import { forwardAdmin } from './admin/socket.js';
import { dataDirOwner } from './store/data-dir-lock.js';
import { openStore } from './store/open.js';
import { loadMasterKey, SecretBox } from './security/secret-box.js';
import { UwsUnavailableError } from './http/uws.js';

const USAGE = `usage: poolgate <command>
  start       every role in one process (embedded PGlite store in POOLGATE_DATA_DIR unless DATABASE_URL)
  control     the Control API only            (needs DATABASE_URL)
  dataplane   pool traffic, lock API, metrics (needs DATABASE_URL)
  worker      async jobs and webhook deliveries (needs DATABASE_URL)
  admin …     operator commands: poolgate admin --help`;

const ROLES: Record<string, RoleName[]> = {
  start: ['control', 'dataplane', 'worker'],
  control: ['control'],
  dataplane: ['dataplane'],
  worker: ['worker'],
};

async function serve(config: Config, roles: RoleName[]): Promise<void> {
  const service = await startService({ config, roles });
  process.stdout.write(JSON.stringify({ event: 'listening', ...service.ports, roles, store: service.sql.engine }) + '\n');
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`poolgate: ${signal}, shutting down\n`);
    const force = setTimeout(() => process.exit(1), 30_000);
    force.unref();
    void service.close().then(
      () => process.exit(0),
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
  const dataDir = resolve(config.dataDir);
  let result = config.databaseUrl ? null : await forwardAdmin(dataDir, argv);
  if (!result) {
    if (!config.databaseUrl && dataDirOwner(dataDir) !== null) {
      process.stderr.write(`poolgate admin: the process holding ${dataDir} does not answer on its admin socket\n`);
      return 1;
    }
    const sql = await openStore(config);
    try {
      const box = new SecretBox(loadMasterKey(config.secretKey, config.dataDir));
      result = await runAdmin(argv, { config, sql, box, now: () => new Date() });
    } finally {
      await sql.close();
    }
  }
  process.stdout.write(result.stdout);
  process.stderr.write(result.stderr);
  return result.code;
}

export async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (!command || command === '--help' || command === '-h' || command === 'help') {
    process.stdout.write(USAGE + '\n');
    return;
  }
  try {
    const config = loadConfig();
    if (command === 'admin') {
      process.exitCode = await admin(config, rest);
      return;
    }
    const roles = ROLES[command];
    if (!roles) {
      process.stderr.write(`unknown command: ${command}\n${USAGE}\n`);
      process.exitCode = 2;
      return;
    }
    await serve(config, roles);
  } catch (err) {
    if (err instanceof ConfigError || err instanceof UwsUnavailableError) process.stderr.write(`poolgate: ${err.message}\n`);
    else process.stderr.write(`poolgate: ${(err as Error).message}\n`);
    process.exit(1);
  }
}
