// Which Redis a node talks to, from the config: one server (redisUrl redis://…), a Sentinel-watched primary
// (a redis+sentinel:// URL, or redisSentinels with redisSentinelMaster) or a Cluster (redisClusterNodes). Pure
// parsing, no client: it runs at config load, so a bad address stops the node at start with a clear error.

export interface HostPort {
  host: string;
  port: number;
}

export type RedisTarget =
  | { kind: 'single'; url: string }
  | { kind: 'sentinel'; sentinels: HostPort[]; name: string; username?: string; password?: string; sentinelPassword?: string; db: number; tls: boolean }
  | { kind: 'cluster'; nodes: HostPort[]; username?: string; password?: string; tls: boolean };

/** The Redis keys of the config (and only those: the roles pass the whole config). */
export interface RedisConfig {
  readonly redisUrl: string | null;
  readonly redisSentinels: string | null;
  readonly redisSentinelMaster: string | null;
  readonly redisClusterNodes: string | null;
  readonly redisPassword: string | null;
  readonly redisTls: boolean;
}

export class RedisTargetError extends Error {
  override name = 'RedisTargetError';
}

const HOST_PORT = /^(?:\[([0-9a-fA-F:.]+)\]|([A-Za-z0-9._-]+)):(\d{1,5})$/;

/** "host:port,host:port" (IPv6 in brackets); `what` names the setting in the error. */
export function parseHostList(list: string, what: string): HostPort[] {
  const out: HostPort[] = [];
  for (const raw of list.split(',')) {
    const item = raw.trim();
    if (item === '') continue;
    const m = HOST_PORT.exec(item);
    const port = m ? Number(m[3]) : NaN;
    if (!m || !(port >= 1 && port <= 65535)) throw new RedisTargetError(`${what}: ${JSON.stringify(item)} is not host:port`);
    out.push({ host: m[1] ?? m[2]!, port });
  }
  if (out.length === 0) throw new RedisTargetError(`${what}: no host:port given`);
  return out;
}

/**
 * redis+sentinel://[[user]:password@]host:port[,host:port…]/<master name>[/<db>][?sentinelPassword=…]
 * (rediss+sentinel:// for TLS to the sentinels and the primary). The form most clients and managed offers use.
 */
export function parseSentinelUrl(url: string): Extract<RedisTarget, { kind: 'sentinel' }> {
  const m = /^(rediss?)\+sentinel:\/\/(?:([^@/]*)@)?([^/?#]+)\/([^/?#]+)(?:\/(\d+))?\/?(?:\?([^#]*))?$/.exec(url);
  if (!m) throw new RedisTargetError(`redisUrl: ${JSON.stringify(redact(url))} is not redis+sentinel://[:password@]host:port[,host:port…]/<master name>[/<db>]`);
  const [, scheme, auth, hosts, name, db, query] = m;
  let username: string | undefined;
  let password: string | undefined;
  if (auth !== undefined) {
    const colon = auth.indexOf(':');
    username = decodeURIComponent(colon < 0 ? auth : auth.slice(0, colon)) || undefined;
    password = colon < 0 ? undefined : decodeURIComponent(auth.slice(colon + 1)) || undefined;
  }
  const params = new URLSearchParams(query ?? '');
  for (const k of params.keys()) if (k !== 'sentinelPassword') throw new RedisTargetError(`redisUrl: unknown parameter ${JSON.stringify(k)} (only sentinelPassword)`);
  return {
    kind: 'sentinel',
    sentinels: parseHostList(hosts!, 'redisUrl sentinels'),
    name: decodeURIComponent(name!),
    username,
    password,
    sentinelPassword: params.get('sentinelPassword') ?? undefined,
    db: db === undefined ? 0 : Number(db),
    tls: scheme === 'rediss',
  };
}

function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}

/**
 * The one Redis target the config names, or null without Redis. Exactly one form may be set; every
 * mistake is a RedisTargetError naming the setting.
 */
export function redisTarget(c: RedisConfig): RedisTarget | null {
  const forms = [c.redisUrl !== null && 'redisUrl', c.redisSentinels !== null && 'redisSentinels', c.redisClusterNodes !== null && 'redisClusterNodes'].filter(Boolean);
  if (forms.length > 1) throw new RedisTargetError(`set one of redisUrl, redisSentinels and redisClusterNodes, not ${forms.join(' and ')}`);
  if (c.redisSentinelMaster !== null && c.redisSentinels === null) throw new RedisTargetError('redisSentinelMaster is set without redisSentinels');
  const password = c.redisPassword ?? undefined;
  if (c.redisUrl !== null) {
    const url = c.redisUrl;
    if (/^rediss?\+sentinel:/.test(url)) {
      const s = parseSentinelUrl(url);
      return { ...s, password: s.password ?? password, tls: s.tls || c.redisTls };
    }
    if (!/^rediss?:\/\//.test(url)) throw new RedisTargetError(`redisUrl: ${JSON.stringify(redact(url))} is not redis://, rediss:// or redis+sentinel://`);
    try {
      new URL(url);
    } catch {
      throw new RedisTargetError(`redisUrl: ${JSON.stringify(redact(url))} is not a URL`);
    }
    return { kind: 'single', url };
  }
  if (c.redisSentinels !== null) {
    if (c.redisSentinelMaster === null) throw new RedisTargetError('redisSentinels needs redisSentinelMaster (the name the sentinels monitor the primary by)');
    return { kind: 'sentinel', sentinels: parseHostList(c.redisSentinels, 'redisSentinels'), name: c.redisSentinelMaster, password, db: 0, tls: c.redisTls };
  }
  if (c.redisClusterNodes !== null) return { kind: 'cluster', nodes: parseHostList(c.redisClusterNodes, 'redisClusterNodes'), password, tls: c.redisTls };
  return null;
}

/** For logs and the start line: the target without secrets. */
export function describeTarget(t: RedisTarget): string {
  if (t.kind === 'single') return redact(t.url);
  const hosts = (t.kind === 'sentinel' ? t.sentinels : t.nodes).map((h) => `${h.host}:${h.port}`).join(',');
  return t.kind === 'sentinel' ? `sentinel ${hosts} master ${t.name}` : `cluster ${hosts}`;
}
