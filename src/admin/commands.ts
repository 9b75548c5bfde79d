// `poolgate admin …`: the operator's side of what the spec puts in the dashboard and organization settings.
// Each command is a function of (args, store) that returns JSON or fails with a usage message; the CLI
// runs it on the store directly or forwards it to the process that holds the embedded store.
import { parseArgs } from 'node:util';
import { ABILITIES } from '../control/schemas.js';
import { CHANGE_CHANNEL } from '../store/sql.js';
import { AdminUsageError, intOption, need, oneOf, teamOf, type AdminDeps, type AdminResult, type Command } from './command.js';
import { webhookCommands } from './webhook-commands.js';
import { budgetCommands } from './budget-commands.js';
import { poolCommands } from './pool-commands.js';
import { poolKeyCommands } from './pool-key-commands.js';
import { createLoginLink } from '../store/sessions.js';
import type { Config } from '../config/schema.js';
import { version as packageVersion } from '../version.js';
import {
  PLANS,
  ROLES,
  createTeam,
  createToken,
  createUser,
  findUser,
  findTeams,
  type Plan,
  type TeamRow,
  type UserRow,
  type Role,
  type TokenLifetime,
} from '../store/teams.js';

export { AdminUsageError, type AdminDeps, type AdminResult } from './command.js';

// `1m` reads as a minute as easily as a month: the CLI takes `1mo` and refuses the bare `m` (the API's value stays `1m`).
const LIFETIME_NAMES: Record<string, TokenLifetime> = {
  '1mo': '1m', '1month': '1m', '1-month': '1m', month: '1m',
  '6mo': '6m', '6months': '6m', '6-months': '6m',
  '1y': '1y', '1year': '1y', '1-year': '1y', year: '1y', '12mo': '1y',
};

function parseLifetime(raw: string): TokenLifetime {
  const v = raw.trim().toLowerCase();
  const lifetime = LIFETIME_NAMES[v];
  if (lifetime) return lifetime;
  if (/^\d+m$/.test(v)) throw new AdminUsageError(`--lifetime ${raw} is ambiguous (minutes or months?): say 1mo, 6mo or 1y`);
  throw new AdminUsageError('--lifetime must be 1mo, 6mo or 1y (1 month, 6 months, 1 year)');
}

function parseAbilities(raw: string | undefined): string[] {
  if (!raw || raw === 'all') return [...ABILITIES];
  const list = raw.split(',').map((s) => s.trim()).filter(Boolean);
  for (const a of list) oneOf(a, ABILITIES, 'abilities');
  return [...new Set(list)];
}

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;

export const commands: Record<string, Command> = {
  bootstrap: {
    usage: 'admin bootstrap --team NAME --email EMAIL [--name NAME] [--plan free|pro|team|business]',
    options: { team: { type: 'string' }, email: { type: 'string' }, name: { type: 'string' }, plan: { type: 'string' } },
    async run(v, deps) {
      const teamName = need(v, 'team');
      const email = need(v, 'email');
      if (!EMAIL.test(email)) throw new AdminUsageError('--email is not an email address');
      const plan = oneOf((v.plan as string | undefined) ?? 'free', PLANS, 'plan') as Plan;
      const userName = (v.name as string | undefined)?.trim() || email.split('@')[0]!;
      return deps.sql.transaction(async (tx) => {
        // Idempotent: the same team and owner again get a new token, never a second team (acme-2) or user.
        const existing = await findTeams(tx, teamName);
        let created = true;
        let team: TeamRow;
        let user: UserRow;
        if (existing.length > 0) {
          if (existing.length > 1) throw new AdminUsageError(`${existing.length} teams are named ${JSON.stringify(teamName)} (${existing.map((t) => t.slug).join(', ')}); nothing changed`);
          team = existing[0]!;
          const owner = await findUser(tx, team.id, email);
          if (!owner || owner.role !== 'owner') {
            throw new AdminUsageError(
              `team ${JSON.stringify(team.name)} (slug ${team.slug}) already exists and ${email} is not its owner; nothing changed. ` +
              `Add a user with \`admin user add --team ${team.slug}\`, or bootstrap another team name`,
            );
          }
          user = owner;
          created = false;
        } else {
          team = await createTeam(tx, teamName, plan);
          user = await createUser(tx, team.id, userName, email, 'owner');
        }
        const tok = await createToken(tx, user, { name: 'bootstrap', abilities: ABILITIES, lifetime: '1y', now: deps.now() });
        return {
          created,
          token: tok.token,
          team: { id: team.id, name: team.name, slug: team.slug, plan: team.plan },
          user: { id: user.id, name: user.name, email: user.email, role: user.role },
          abilities: tok.abilities,
          expires_at: tok.expires_at.toISOString(),
        };
      });
    },
  },

  'user add': {
    usage: 'admin user add --team TEAM --email EMAIL [--name NAME] [--role owner|admin|member]',
    options: { team: { type: 'string' }, email: { type: 'string' }, name: { type: 'string' }, role: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const email = need(v, 'email');
      if (!EMAIL.test(email)) throw new AdminUsageError('--email is not an email address');
      const role = oneOf((v.role as string | undefined) ?? 'member', ROLES, 'role') as Role;
      if (await findUser(deps.sql, team.id, email)) throw new AdminUsageError(`user ${email} already exists in team ${team.slug}`);
      const user = await createUser(deps.sql, team.id, (v.name as string | undefined)?.trim() || email.split('@')[0]!, email, role);
      return { user: { id: user.id, name: user.name, email: user.email, role: user.role }, team: { id: team.id, slug: team.slug } };
    },
  },

  'token create': {
    usage: 'admin token create --team TEAM --user EMAIL|ID [--abilities all|a,b,…] [--lifetime 1mo|6mo|1y] [--name NAME]',
    options: { team: { type: 'string' }, user: { type: 'string' }, abilities: { type: 'string' }, lifetime: { type: 'string' }, name: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const user = await findUser(deps.sql, team.id, need(v, 'user'));
      if (!user) throw new AdminUsageError(`user ${JSON.stringify(v.user)} not found in team ${team.slug}`);
      // Only owners and admins can create tokens (spec: Authentication, Control API 2).
      if (user.role === 'member') throw new AdminUsageError('only owners and admins can create API tokens');
      const lifetime = parseLifetime((v.lifetime as string | undefined) ?? '1y');
      const tok = await createToken(deps.sql, user, {
        name: (v.name as string | undefined)?.trim() || 'cli',
        abilities: parseAbilities(v.abilities as string | undefined),
        lifetime,
        now: deps.now(),
      });
      return { id: tok.id, token: tok.token, name: tok.name, abilities: tok.abilities, expires_at: tok.expires_at.toISOString() };
    },
  },

  'team list': {
    usage: 'admin team list   (every team: id, slug, name, plan, users, pools)',
    options: {},
    async run(_v, deps) {
      const { rows } = await deps.sql.query<Record<string, unknown>>(
        `SELECT t.id, t.slug, t.name, t.plan, t.created_at,
                (SELECT count(*)::int FROM users u WHERE u.team_id = t.id) AS users,
                (SELECT count(*)::int FROM pools p WHERE p.team_id = t.id) AS pools
         FROM teams t ORDER BY t.id`,
      );
      return { teams: rows.map((r) => ({ ...r, created_at: iso(r.created_at) })) };
    },
  },

  'user list': {
    usage: 'admin user list --team TEAM',
    options: { team: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const { rows } = await deps.sql.query<Record<string, unknown>>(
        'SELECT id, name, email, role, created_at FROM users WHERE team_id = $1 ORDER BY id', [team.id],
      );
      return { team: { id: team.id, slug: team.slug }, users: rows.map((r) => ({ ...r, created_at: iso(r.created_at) })) };
    },
  },

  'token list': {
    usage: 'admin token list --team TEAM [--all]   (active tokens; --all adds revoked and expired ones)',
    options: { team: { type: 'string' }, all: { type: 'boolean' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const { rows } = await deps.sql.query<Record<string, unknown>>(
        `SELECT t.id, t.name, '…' || t.last_four AS token, u.email AS user, t.abilities, t.created_at, t.expires_at, t.revoked_at
         FROM api_tokens t JOIN users u ON u.id = t.user_id
         WHERE t.team_id = $1 AND ($2 OR (t.revoked_at IS NULL AND t.expires_at > $3)) ORDER BY t.id`,
        [team.id, v.all === true, deps.now()],
      );
      const tokens = rows.map((r) => ({ ...r, created_at: iso(r.created_at), expires_at: iso(r.expires_at), revoked_at: iso(r.revoked_at) }));
      return { team: { id: team.id, slug: team.slug }, tokens };
    },
  },

  'token revoke': {
    usage: 'admin token revoke --team TEAM --id TOKEN_ID',
    options: { team: { type: 'string' }, id: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const id = intOption(need(v, 'id'), 'id', 1);
      const { rows } = await deps.sql.query<{ id: number; revoked_at: Date }>(
        `UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, $3) WHERE id = $1 AND team_id = $2 RETURNING id, revoked_at`,
        [id, team.id, deps.now()],
      );
      if (!rows[0]) throw new AdminUsageError(`token ${id} not found in team ${team.slug}`);
      // Control API processes cache recently seen tokens; this drops them everywhere at once.
      await deps.sql.notify(CHANGE_CHANNEL, `token:${id}`);
      return { id: rows[0].id, revoked_at: rows[0].revoked_at.toISOString() };
    },
  },

  'login-link': {
    usage: 'admin login-link --team TEAM --email EMAIL   (a one-time dashboard sign-in link, valid 15 minutes)',
    options: { team: { type: 'string' }, email: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const user = await findUser(deps.sql, team.id, need(v, 'email'));
      if (!user) throw new AdminUsageError(`user ${JSON.stringify(v.email)} not found in team ${team.slug}`);
      const { link, expiresAt } = await createLoginLink(deps.sql, team.id, user.id, deps.now());
      // The secret rides in the fragment: browsers never send it to a server or in a Referer.
      return { url: `${dashboardBase(deps.config)}/login#${link}`, expires_at: expiresAt.toISOString(), user: { id: user.id, email: user.email, role: user.role } };
    },
  },

  'plan set': {
    usage: 'admin plan set --team TEAM --plan free|pro|team|business',
    options: { team: { type: 'string' }, plan: { type: 'string' } },
    async run(v, deps) {
      const team = await teamOf(deps, need(v, 'team'));
      const plan = oneOf(need(v, 'plan'), PLANS, 'plan');
      await deps.sql.query('UPDATE teams SET plan = $2 WHERE id = $1', [team.id, plan]);
      await deps.sql.notify(CHANGE_CHANNEL, `team:${team.id}`);
      return { team: { id: team.id, slug: team.slug, plan } };
    },
  },

  ...webhookCommands,
  ...budgetCommands,
  ...poolCommands,
  ...poolKeyCommands,
};

function iso(v: unknown): string | null {
  return v instanceof Date ? v.toISOString() : v == null ? null : String(v);
}

/** The dashboard's public address as the control process derives it (src/service.ts). */
function dashboardBase(config: Config): string {
  if (config.dashboardUrl) return config.dashboardUrl.replace(/\/+$/, '');
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  const base = config.baseUrl ?? `http://${host.includes(':') ? `[${host}]` : host}:${config.controlPort}`;
  return `${base.replace(/\/+$/, '')}/dashboard`;
}

export function helpText(): string {
  return ['usage: poolgate admin <command> [options]  (--help on any command)', '', ...Object.values(commands).map((c) => `  poolgate ${c.usage}`)].join('\n');
}

/** A command line resolved without the store: the answer itself (help, a usage mistake), or a command to run. */
export type AdminInvocation =
  | { answer: AdminResult }
  | { name: string; cmd: Command; values: Record<string, string | boolean | undefined> };

/**
 * Resolves the command and parses its options. Help and command-line mistakes are answered here, so the CLI
 * opens no store for them (opening the embedded one costs seconds).
 */
export function parseAdmin(argv: readonly string[]): AdminInvocation {
  const words = argv.filter((a) => !a.startsWith('-'));
  const name = [words.slice(0, 2).join(' '), words[0] ?? ''].find((n) => n in commands);
  if (!name) {
    if (argv.length === 1 && (argv[0] === '--version' || argv[0] === '-v')) return { answer: { code: 0, stdout: `${packageVersion()}\n`, stderr: '' } };
    const asked = argv.length === 0 || argv.includes('--help') || argv.includes('-h');
    return { answer: { code: asked ? 0 : 2, stdout: asked ? helpText() + '\n' : '', stderr: asked ? '' : `unknown admin command: ${words.length > 0 ? words.join(' ') : argv.join(' ')}\n${helpText()}\n` } };
  }
  const cmd = commands[name]!;
  const rest = [...argv];
  for (const w of name.split(' ')) rest.splice(rest.indexOf(w), 1);
  if (rest.includes('--help') || rest.includes('-h')) return { answer: { code: 0, stdout: `usage: poolgate ${cmd.usage}\n`, stderr: '' } };
  try {
    const { values, positionals } = parseArgs({ args: rest, options: cmd.options, strict: true, allowPositionals: cmd.positional !== undefined });
    if (cmd.positional !== undefined && positionals.length > 0) {
      if (positionals.length > 1) throw new AdminUsageError(`unexpected arguments: ${positionals.slice(1).join(' ')}`);
      (values as Record<string, unknown>)[cmd.positional] ??= positionals[0];
    }
    return { name, cmd, values: values as Record<string, string | boolean | undefined> };
  } catch (err) {
    return { answer: failure(name, cmd, err) };
  }
}

/** Runs a parsed command against the store. */
export async function runParsedAdmin(inv: Exclude<AdminInvocation, { answer: AdminResult }>, deps: AdminDeps): Promise<AdminResult> {
  try {
    const out = await inv.cmd.run(inv.values, deps);
    return { code: 0, stdout: JSON.stringify(out) + '\n', stderr: '' };
  } catch (err) {
    return failure(inv.name, inv.cmd, err);
  }
}

/** Runs one admin command line (argv after `admin`) and returns what to print. Never throws. */
export async function runAdmin(argv: readonly string[], deps: AdminDeps): Promise<AdminResult> {
  const inv = parseAdmin(argv);
  return 'answer' in inv ? inv.answer : runParsedAdmin(inv, deps);
}

function failure(name: string, cmd: Command, err: unknown): AdminResult {
  const e = err as Error & { code?: string };
  if (err instanceof AdminUsageError || e.code?.startsWith('ERR_PARSE_ARGS')) {
    return { code: 2, stdout: '', stderr: `${e.message}\nusage: poolgate ${cmd.usage}\n` };
  }
  if (e.code === '23505') return { code: 1, stdout: '', stderr: `already exists: ${e.message}\n` };
  return { code: 1, stdout: '', stderr: `admin ${name} failed: ${e.message}\n` };
}
