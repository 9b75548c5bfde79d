// Refusals whose fix is a setting name it (issue 20): the environment variable and the config key, and what it is for.

export const ALLOW_PRIVATE_HINT = 'set POOLGATE_ALLOW_PRIVATE_TARGETS=true (allowPrivateTargets) to allow loopback and private targets, for local use';

export const ALLOW_INSECURE_HINT = 'the database server refuses TLS: set POOLGATE_DB_ALLOW_INSECURE=true (dbAllowInsecure) to connect to it without TLS, for local use';

/** Adds the dbAllowInsecure hint to a "server refuses TLS" error (in place: its type and code stay what callers test). */
export function withInsecureHint(err: unknown): unknown {
  if (err instanceof Error && !err.message.includes('POOLGATE_DB_ALLOW_INSECURE')) err.message = `${err.message} (${ALLOW_INSECURE_HINT})`;
  return err;
}
