// Builds the one frozen Config object: schema defaults < config/default.json < POOLGATE_CONFIG < env < overrides.
import { readFileSync } from 'node:fs';
import { Value } from '@sinclair/typebox/value';
import type { TSchema } from '@sinclair/typebox';
import { ConfigSchema, configEntries, type Config } from './schema.js';
import { fromRoot } from './paths.js';
import { redisTarget, RedisTargetError } from './redis-target.js';

export class ConfigError extends Error {
  override name = 'ConfigError';
}

function readJsonFile(path: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read config file ${path}: ${(err as Error).message}`);
  }
  try {
    const parsed = JSON.parse(text) as unknown;
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('not a JSON object');
    const { $schema: _ignored, ...rest } = parsed as Record<string, unknown>;
    return rest;
  } catch (err) {
    throw new ConfigError(`config file ${path} is not a JSON object: ${(err as Error).message}`);
  }
}

function kindOf(schema: TSchema): string {
  if (schema.anyOf) return (schema.anyOf as TSchema[]).map(kindOf).find((k) => k !== 'null') ?? 'string';
  return typeof schema.type === 'string' ? schema.type : 'string';
}

function parseEnv(name: string, raw: string, schema: TSchema): unknown {
  const nullable = Array.isArray(schema.anyOf) && (schema.anyOf as TSchema[]).some((s) => s.type === 'null');
  if (raw === '' && nullable) return null;
  switch (kindOf(schema)) {
    case 'integer':
      if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(`${name} must be an integer, got ${JSON.stringify(raw)}`);
      return Number(raw.trim());
    case 'boolean': {
      const v = raw.trim().toLowerCase();
      if (['1', 'true', 'yes', 'on'].includes(v)) return true;
      if (['0', 'false', 'no', 'off', ''].includes(v)) return false;
      throw new ConfigError(`${name} must be true or false, got ${JSON.stringify(raw)}`);
    }
    default:
      return raw;
  }
}

export interface LoadOptions {
  env?: NodeJS.ProcessEnv;
  overrides?: Partial<Record<keyof Config, unknown>>;
}

export function loadConfig(opts: LoadOptions = {}): Config {
  const env = opts.env ?? process.env;
  const merged: Record<string, unknown> = Value.Default(ConfigSchema, {}) as Record<string, unknown>;
  Object.assign(merged, readJsonFile(fromRoot('config', 'default.json')));
  if (env.POOLGATE_CONFIG) Object.assign(merged, readJsonFile(env.POOLGATE_CONFIG));
  for (const entry of configEntries) {
    const raw = env[entry.env];
    if (raw !== undefined) merged[entry.key] = parseEnv(entry.env, raw, entry.schema);
  }
  if (opts.overrides) Object.assign(merged, opts.overrides);
  const errors = [...Value.Errors(ConfigSchema, merged)];
  if (errors.length > 0) {
    const lines = errors.slice(0, 10).map((e) => {
      const key = e.path.replace(/^\//, '');
      const entry = configEntries.find((c) => c.key === key);
      return `  ${key || '(root)'}${entry ? ` (${entry.env})` : ''}: ${e.message}`;
    });
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  const config = Object.freeze(merged) as Config;
  try {
    redisTarget(config);
  } catch (err) {
    if (err instanceof RedisTargetError) throw new ConfigError(`invalid configuration:\n  ${err.message}`);
    throw err;
  }
  return config;
}
