// Liveness and readiness of one poolgate process (every role it runs), served without auth at /livez, /readyz
// and /healthz on the control port and on the metrics port (docs/operations.md).

/** One dependency's state: `ok` false makes the process not ready (unless `required` is false). */
export interface CheckResult {
  ok: boolean;
  detail?: string;
}

export interface HealthCheck {
  readonly name: string;
  /** When false, a failing check is reported but does not make the process not ready. */
  readonly required: boolean;
  run(): Promise<CheckResult> | CheckResult;
}

export interface HealthReport {
  status: 'ok' | 'starting' | 'draining' | 'failing';
  roles: readonly string[];
  checks: Record<string, CheckResult & { required: boolean }>;
}

/** A check that takes longer than this counts as failing (a hung store must not hang the probe). */
const CHECK_TIMEOUT_MS = 2_000;

export class Health {
  readonly roles: readonly string[];
  readonly #checks: HealthCheck[] = [];
  readonly #timeoutMs: number;
  #state: 'starting' | 'serving' | 'draining' = 'starting';

  constructor(roles: readonly string[], opts: { checkTimeoutMs?: number } = {}) {
    this.roles = roles;
    this.#timeoutMs = opts.checkTimeoutMs ?? CHECK_TIMEOUT_MS;
  }

  add(check: HealthCheck): void {
    this.#checks.push(check);
  }

  /** Every listener of every role is bound: readiness now depends on the checks. */
  serving(): void {
    if (this.#state === 'starting') this.#state = 'serving';
  }

  /** Shutdown began: not ready from now on, so balancers stop sending while in-flight work drains. */
  draining(): void {
    this.#state = 'draining';
  }

  get state(): 'starting' | 'serving' | 'draining' {
    return this.#state;
  }

  async report(): Promise<HealthReport> {
    const checks: HealthReport['checks'] = {};
    await Promise.all(
      this.#checks.map(async (c) => {
        checks[c.name] = { ...(await runWithTimeout(c, this.#timeoutMs)), required: c.required };
      }),
    );
    const failing = this.#checks.some((c) => c.required && !checks[c.name].ok);
    const status = this.#state === 'serving' ? (failing ? 'failing' : 'ok') : this.#state;
    return { status, roles: this.roles, checks };
  }
}

async function runWithTimeout(c: HealthCheck, timeoutMs: number): Promise<CheckResult> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      Promise.resolve().then(() => c.run()),
      new Promise<CheckResult>((resolve) => {
        timer = setTimeout(() => resolve({ ok: false, detail: `no answer within ${timeoutMs} ms` }), timeoutMs);
      }),
    ]);
  } catch (err) {
    return { ok: false, detail: err instanceof Error ? err.message : String(err) };
  } finally {
    clearTimeout(timer);
  }
}

export const HEALTH_PATHS = ['/livez', '/readyz', '/healthz'] as const;

/**
 * The answer for a health path: /livez is 200 while the process answers at all (a restart would not help
 * anything else); /readyz and /healthz are 200 only when serving and every required check passes, 503 otherwise,
 * with the report as the body either way.
 */
export async function healthAnswer(health: Health, path: string): Promise<{ status: number; body: unknown }> {
  if (path === '/livez') return { status: 200, body: { status: 'ok', roles: health.roles } };
  const report = await health.report();
  return { status: report.status === 'ok' ? 200 : 503, body: report };
}
