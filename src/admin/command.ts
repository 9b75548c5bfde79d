// The shape of one admin command and the option parsing every command shares.
import type { ParseArgsConfig } from 'node:util';
import type { Config } from '../config/schema.js';
import type { LiveSource } from '../control/context.js';
import type { SecretBox } from '../security/secret-box.js';
import type { Sql } from '../store/sql.js';
import { findTeams, type TeamRow } from '../store/teams.js';

export interface AdminDeps {
  config: Config;
  sql: Sql;
  box: SecretBox;
  now: () => Date;
  /** The data plane's live state, when the command runs in the process that serves pool traffic. */
  live?: { source: LiveSource | null };
}

/** A mistake in the command line: exit 2 with the message and the command's usage. */
export class AdminUsageError extends Error {
  override name = 'AdminUsageError';
}

export interface AdminResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface Command {
  usage: string;
  options: NonNullable<ParseArgsConfig['options']>;
  /** The option one bare word fills (e.g. `pool show <subdomain>` fills --pool); absent: no bare words. */
  positional?: string;
  run(values: Record<string, string | boolean | undefined>, deps: AdminDeps): Promise<unknown>;
}

export function need(values: Record<string, unknown>, name: string): string {
  const v = values[name];
  if (typeof v !== 'string' || v.trim() === '') throw new AdminUsageError(`--${name} is required`);
  return v.trim();
}

export function oneOf<T extends string>(value: string, allowed: readonly T[], name: string): T {
  if (!(allowed as readonly string[]).includes(value)) throw new AdminUsageError(`--${name} must be one of ${allowed.join(', ')}`);
  return value as T;
}

export function intOption(value: string, name: string, min: number, max = 2147483647): number {
  if (!/^\d{1,10}$/.test(value) || Number(value) < min || Number(value) > max) {
    throw new AdminUsageError(`--${name} must be an integer from ${min} to ${max}`);
  }
  return Number(value);
}

/** The team `--team` names: its id, slug or name; several teams of that name are refused, listing their slugs. */
export async function teamOf(deps: AdminDeps, ref: string): Promise<TeamRow> {
  const teams = await findTeams(deps.sql, ref);
  if (teams.length === 0) throw new AdminUsageError(`team ${JSON.stringify(ref)} not found (give its slug, name or id)`);
  if (teams.length > 1) throw new AdminUsageError(`${teams.length} teams are named ${JSON.stringify(ref)}: give the slug (${teams.map((t) => t.slug).join(', ')})`);
  return teams[0]!;
}
