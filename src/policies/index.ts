// The policies stage (stage 4): each pool's policies compiled once from its settings and run in a
// fixed order (access proxy, IP allowlist, HMAC, JWT) after key auth and scope, before a slot is taken.
// The data plane and the lock API both run it; each refusal is counted by pool, policy and reason.
import type { KeyEntry, PoolEntry } from '../pool-request/snapshot.js';
import type { PoolSettings } from '../store/pool-settings.js';
import type { ConnectTargets } from '../security/ssrf-connect-guard.js';
import { accessProxyPolicy } from './access-proxy.js';
import { CidrList } from '../domain/cidr.js';
import { clientAddress } from './client-address.js';
import { hmacPolicy } from './hmac.js';
import { ipAllowlistPolicy } from './ip-allowlist.js';
import { jwksFetcher, jwtPolicy, type JwksFetch } from './jwt.js';
import { MemoryNonceStore, type NonceStore } from './nonce-store.js';
import { BodyLimit } from '../pool-request/body-limit.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest, type Verdict } from './policy.js';

export type { PolicyRefusal, PolicyRequest, Verdict } from './policy.js';

/** The compiled policies of one pool. */
export interface PoolPolicies {
  readonly policies: readonly Policy[];
  /** HMAC is on: the whole body must be read (up to signedBody) before checking. */
  readonly needsBody: boolean;
  /** The pool's signedBodyLimit (the 413 rule), when it signs requests. */
  readonly signedBody: BodyLimit | null;
}

const NONE: PoolPolicies = { policies: [], needsBody: false, signedBody: null };

/** The settings that shape a pool's policies (a change to anything else keeps the compiled ones). */
function policyKey(s: PoolSettings): string {
  return JSON.stringify([s.ipAllowlist, s.accessProxy, s.originSigning, s.signatureWindowSec, s.signedBodyLimit, s.jwt]);
}

export interface PoliciesOptions {
  config: { trustedProxies?: readonly string[] };
  clock?: () => number;
  /** Called once per refusal (the Prometheus counter). */
  onRefusal?: (pool: string, policy: string, reason: string) => void;
  /** Where HMAC nonces are remembered: Redis with redisUrl (the data plane role passes it), else in memory. */
  nonces?: NonceStore;
  /** The SSRF guard JWKS fetches connect through; absent: allowPrivateTargets off, system DNS. */
  targets?: ConnectTargets;
}

export class Policies {
  readonly #byPool = new Map<number, { settings: PoolSettings; key: string; compiled: PoolPolicies }>();
  readonly #trusted: CidrList;
  readonly #clock: () => number;
  readonly #onRefusal: PoliciesOptions['onRefusal'];
  #nonces: NonceStore | null;
  readonly #targets: ConnectTargets | undefined;
  #jwks: { fetch: JwksFetch; close(): Promise<void> } | null = null;

  constructor(opts: PoliciesOptions) {
    this.#targets = opts.targets;
    this.#trusted = new CidrList(opts.config.trustedProxies ?? []);
    this.#clock = opts.clock ?? Date.now;
    this.#onRefusal = opts.onRefusal;
    this.#nonces = opts.nonces ?? null;
  }

  /** The one passed in, or one in memory made at first use. */
  #nonceStore(): NonceStore {
    this.#nonces ??= new MemoryNonceStore({ clock: this.#clock });
    return this.#nonces;
  }

  /** One guarded connection pool for every pool's JWKS fetches, created on first use. */
  #jwksFetch(): JwksFetch {
    this.#jwks ??= jwksFetcher(this.#targets);
    return this.#jwks.fetch;
  }

  /** The pool's compiled policies; recompiled only when a policy setting changed. */
  forPool(pool: PoolEntry): PoolPolicies {
    const hit = this.#byPool.get(pool.id);
    if (hit && hit.settings === pool.settings) return hit.compiled;
    const key = policyKey(pool.settings);
    if (hit && hit.key === key) {
      hit.settings = pool.settings;
      return hit.compiled;
    }
    const compiled = this.#compile(pool);
    this.#byPool.set(pool.id, { settings: pool.settings, key, compiled });
    return compiled;
  }

  #compile(pool: PoolEntry): PoolPolicies {
    const s = pool.settings;
    const list: Policy[] = [];
    try {
      if (s.accessProxy) list.push(accessProxyPolicy(s.accessProxy));
      if (s.ipAllowlist.length > 0) list.push(ipAllowlistPolicy(s.ipAllowlist));
      if (s.originSigning) list.push(hmacPolicy({ windowSec: s.signatureWindowSec, nonces: this.#nonceStore(), clock: this.#clock }));
      if (s.jwt) list.push(jwtPolicy(s.jwt, s.jwt.jwksUrl ? this.#jwksFetch() : undefined, this.#clock));
    } catch (err) {
      // Settings are validated on write; one that cannot compile (a hand edit) closes the pool, never opens it.
      const broken = refuse(503, 'settings', 'misconfigured', `the pool's policies cannot be applied: ${(err as Error).message}`);
      return { policies: [{ name: 'settings', check: () => broken }], needsBody: false, signedBody: null };
    }
    if (list.length === 0) return NONE;
    const signedBody = s.originSigning ? new BodyLimit(s.signedBodyLimit, `a signed request body may be at most ${s.signedBodyLimit} bytes`) : null;
    return { policies: list, needsBody: s.originSigning, signedBody };
  }

  /** The address policies judge for a connection from `peer`. */
  clientAddress(peer: string, headers: Readonly<Record<string, string>>): string {
    return clientAddress(peer, headers['x-forwarded-for'], this.#trusted);
  }

  /**
   * Runs the policies in order; synchronous until one needs to wait (JWT, Redis nonces), then a promise.
   * `from` skips the first policies (already passed).
   */
  run(compiled: PoolPolicies, req: PolicyRequest, body: Buffer | null, from = 0): Verdict | Promise<Verdict> {
    for (let i = from; i < compiled.policies.length; i++) {
      const v = compiled.policies[i]!.check(req, body);
      if (v instanceof Promise) {
        return v.then((r) => (r !== null ? this.#refused(req, r) : this.run(compiled, req, body, i + 1)));
      }
      if (v !== null) return this.#refused(req, v);
    }
    return null;
  }

  /**
   * The policy check for a wire connection (the PostgreSQL and MySQL listeners): the IP allowlist applies
   * to its TCP peer; a policy that judges HTTP requests (signatures, JWTs, access-proxy headers) cannot
   * judge it, so it refuses. Null when the connection may use the pool.
   */
  wireRefusal(pool: PoolEntry, key: KeyEntry | null, peer: string, method: string): WireRefusal | null {
    const compiled = this.forPool(pool);
    if (compiled.policies.length === 0) return null;
    const other = compiled.policies.find((p) => p.name !== 'ip_allowlist');
    if (other) return { reason: 'needs_http', policy: HTTP_POLICY_LABELS[other.name] ?? `its ${other.name} policy` };
    const req: PolicyRequest = { pool, key, keyInAuthorization: false, method, path: '/', query: '', headers: {}, peer, client: peer };
    // The allowlist answers synchronously; a promise would mean a policy this method does not expect: refuse.
    const verdict = this.run(compiled, req, null);
    return verdict === null ? null : { reason: 'address' };
  }

  #refused(req: PolicyRequest, r: PolicyRefusal): PolicyRefusal {
    this.#onRefusal?.(req.pool.subdomain, r.policy, r.reason);
    return r;
  }

  async close(): Promise<void> {
    await this.#nonces?.close();
    await this.#jwks?.close();
  }
}

/** Why a wire connection may not use a pool: a policy that needs HTTP requests, or its address. */
export type WireRefusal = { reason: 'needs_http'; policy: string } | { reason: 'address' };

const HTTP_POLICY_LABELS: Record<string, string> = {
  hmac: 'HMAC request signing',
  jwt: 'a JWT policy',
  access_proxy: 'an access-proxy policy',
  settings: 'policies that cannot be applied (misconfigured)',
};

/**
 * For the lock API's chain: a gate that runs a pool's policies on one acquire. `body` is the raw
 * request body (needed when the pool signs requests). A refusal maps to 403 `unauthorized` (allowlist,
 * access proxy) or 401 `unauthorized` (signature, nonce replay, JWT); 413/503 keep their status.
 */
export type PoliciesGate = (req: Omit<PolicyRequest, 'client'>, body: Buffer | null) => Verdict | Promise<Verdict>;

export function policiesGate(policies: Policies): PoliciesGate {
  return (req, body) => {
    const compiled = policies.forPool(req.pool);
    if (compiled.policies.length === 0) return null;
    return policies.run(compiled, { ...req, client: policies.clientAddress(req.peer, req.headers) }, body);
  };
}
