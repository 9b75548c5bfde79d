// JWT policy (jose): the token from `Authorization: Bearer` (when the pool key travels in X-Service-Key)
// or a configured header, verified against a JWKS URL (cached, refetched on an unknown kid) or static
// keys, with issuer, audience, required claims and a bounded clock skew.
import type { KeyObject } from 'node:crypto';
import { createRemoteJWKSet, customFetch, errors, jwtVerify, type FetchImplementation, type JWTVerifyGetKey, type JWTVerifyOptions } from 'jose';
import { Agent, fetch as undiciFetch } from 'undici';
import { guardedConnector, type ConnectTargets } from '../security/ssrf-connect-guard.js';
import { systemLookup } from '../security/targets.js';
import type { JwtPolicy } from '../store/pool-settings.js';
import { headerValue } from '../pool-request/exchange.js';
import { importStaticKey } from '../domain/jwt-keys.js';
import { refuse, type Policy, type PolicyRefusal, type PolicyRequest, type Verdict } from './policy.js';

export const DEFAULT_JWT_HEADER = 'authorization';
export const DEFAULT_CLOCK_SKEW_SEC = 30;

const MISSING = refuse(401, 'jwt', 'missing_token', 'a JWT is required on this pool');
const KEY_IN_AUTHORIZATION = refuse(401, 'jwt', 'missing_token', 'the JWT goes in Authorization here: send the pool key in X-Service-Key');
const EXPIRED = refuse(401, 'jwt', 'expired', 'the JWT has expired');
const BAD_CLAIMS = refuse(401, 'jwt', 'invalid_claims', 'the JWT claims are not accepted (issuer, audience, required claims or time)');
const BAD_SIGNATURE = refuse(401, 'jwt', 'bad_signature', 'the JWT signature does not verify');
const BAD_TOKEN = refuse(401, 'jwt', 'bad_token', 'the JWT is malformed or uses an algorithm this pool does not accept');
const JWKS_DOWN = refuse(503, 'jwt', 'jwks_unavailable', 'the JWT signing keys cannot be fetched right now');

const BEARER = /^bearer[ \t]+(\S+)[ \t]*$/i;
const VERIFIED_TTL_MS = 60_000;
const VERIFIED_MAX = 10_000;
const JWS_COMPACT = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

function refusalOf(err: unknown): PolicyRefusal {
  if (err instanceof errors.JWTExpired) return EXPIRED;
  if (err instanceof errors.JWTClaimValidationFailed) return BAD_CLAIMS;
  if (err instanceof errors.JWSSignatureVerificationFailed || err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys) return BAD_SIGNATURE;
  if (err instanceof errors.JWKSTimeout || err instanceof errors.JWKSInvalid) return JWKS_DOWN;
  // jose raises plain errors (TypeError, fetch failures) when the JWKS endpoint is unreachable.
  if (!(err instanceof errors.JOSEError)) return JWKS_DOWN;
  return BAD_TOKEN;
}

export type JwksFetch = FetchImplementation;

/**
 * The fetch JWKS requests go through: every connection is re-checked by the SSRF guard (the URL's host was
 * checked when the setting was written, but its name may resolve elsewhere since). A refused address fails
 * the fetch, so the pool fails closed (503 jwks_unavailable). Without targets the guard refuses private
 * addresses and resolves with the system resolver.
 */
export function jwksFetcher(targets: ConnectTargets = { allowPrivate: false, lookup: systemLookup }): { fetch: JwksFetch; close(): Promise<void> } {
  const agent = new Agent({ connect: guardedConnector(targets), keepAliveTimeout: 10_000 });
  return {
    // jose hands the global Headers; undici's fetch reads any iterable headers (its types just differ).
    fetch: (url, options) => undiciFetch(url, { ...options, dispatcher: agent } as unknown as Parameters<typeof undiciFetch>[1]) as unknown as ReturnType<JwksFetch>,
    close: () => agent.close(),
  };
}

/**
 * `fetchJwks`: how the JWKS URL is fetched (jwksFetcher's; absent: jose's default fetch, unguarded). `clock`:
 * Unix ms that exp and nbf are judged by, and the verified-token cache expires by (the data plane's clock).
 */
export function jwtPolicy(cfg: JwtPolicy, fetchJwks?: JwksFetch, clock: () => number = Date.now): Policy {
  const header = cfg.header ?? DEFAULT_JWT_HEADER;
  const options: JWTVerifyOptions = {
    issuer: cfg.issuer,
    audience: cfg.audience,
    algorithms: cfg.algorithms,
    requiredClaims: cfg.requiredClaims,
    clockTolerance: cfg.clockSkewSec ?? DEFAULT_CLOCK_SKEW_SEC,
  };
  const remote: JWTVerifyGetKey | null = cfg.jwksUrl ? createRemoteJWKSet(new URL(cfg.jwksUrl), {
        timeoutDuration: 5000,
        cooldownDuration: 30_000,
        ...(fetchJwks ? { [customFetch]: fetchJwks } : {}),
      }) : null;
  // Static keys are tried in order (no kid to choose by): the first that verifies wins.
  const keys: KeyObject[] = (cfg.keys ?? []).map((k) => importStaticKey(k));

  // Verified tokens, so a caller reusing its token is not re-verified on every request (ES256 costs
  // ~0.4 ms of CPU). An entry lives until the token's exp (plus skew) and at most VERIFIED_TTL_MS, so a
  // key dropped from the JWKS stops admitting within that time.
  const verified = new Map<string, number>();
  const skewMs = (cfg.clockSkewSec ?? DEFAULT_CLOCK_SKEW_SEC) * 1000;

  function remember(token: string, exp: number | undefined): void {
    if (verified.size >= VERIFIED_MAX) verified.clear();
    const now = clock();
    verified.set(token, Math.min(exp === undefined ? Infinity : exp * 1000 + skewMs, now + VERIFIED_TTL_MS));
  }

  /** Synchronous for a token verified before (no promise on that path), a promise otherwise. */
  function verify(token: string): Verdict | Promise<Verdict> {
    const until = verified.get(token);
    if (until !== undefined) {
      if (until > clock()) return null;
      verified.delete(token);
    }
    return verifyOnce(token);
  }

  async function verifyOnce(token: string): Promise<Verdict> {
    const at: JWTVerifyOptions = { ...options, currentDate: new Date(clock()) };
    if (remote) {
      try {
        const { payload } = await jwtVerify(token, remote, at);
        remember(token, payload.exp);
        return null;
      } catch (err) {
        return refusalOf(err);
      }
    }
    let last: PolicyRefusal = BAD_SIGNATURE;
    for (const k of keys) {
      try {
        const { payload } = await jwtVerify(token, k, at);
        remember(token, payload.exp);
        return null;
      } catch (err) {
        last = refusalOf(err);
        // Only a signature mismatch means "try the next key"; anything else is the token's fault.
        if (last !== BAD_SIGNATURE && last !== BAD_TOKEN) return last;
      }
    }
    return last;
  }

  return {
    name: 'jwt',
    check(req: PolicyRequest): Verdict | Promise<Verdict> {
      let token: string | undefined;
      const raw = headerValue(req.headers, header);
      if (header === 'authorization') {
        if (req.keyInAuthorization) return KEY_IN_AUTHORIZATION;
        token = raw === undefined ? undefined : BEARER.exec(raw)?.[1];
      } else if (raw !== undefined) {
        token = BEARER.exec(raw)?.[1] ?? raw.trim();
      }
      if (!token) return MISSING;
      if (!JWS_COMPACT.test(token)) return BAD_TOKEN;
      return verify(token);
    },
  };
}
