// The service log: pino JSON lines on stderr (stdout carries only the machine-readable `listening` line), or, for a
// person at a terminal, one readable line per entry (logFormat pretty, or auto on a TTY).
import { pino, type Logger } from 'pino';

export type { Logger };

export type LogFormat = 'auto' | 'json' | 'pretty';

const LEVELS: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO ', 40: 'WARN ', 50: 'ERROR', 60: 'FATAL' };
const OMIT = new Set(['level', 'time', 'msg', 'pid', 'hostname', 'service']);

/** One pino JSON line as `HH:MM:SS.mmm LEVEL message key=value …` (errors with their stack on the next lines). */
export function prettyLine(json: string): string {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const time = new Date(typeof o.time === 'number' || typeof o.time === 'string' ? o.time : Date.now()).toISOString().slice(11, 23);
  const fields: string[] = [];
  let stack = '';
  for (const [k, v] of Object.entries(o)) {
    if (OMIT.has(k) || v === undefined) continue;
    if (k === 'err' && v && typeof v === 'object') {
      const e = v as { message?: string; stack?: string };
      fields.push(`err=${JSON.stringify(e.message ?? '')}`);
      if (e.stack) stack = `\n    ${e.stack.split('\n').slice(1).join('\n    ').trim()}`;
      continue;
    }
    fields.push(`${k}=${typeof v === 'string' && !/[\s"=]/.test(v) ? v : JSON.stringify(v)}`);
  }
  return `${time} ${LEVELS[o.level as number] ?? String(o.level)} ${String(o.msg ?? '')}${fields.length ? `  ${fields.join(' ')}` : ''}${stack}\n`;
}

export function createLogger(level: string, format: LogFormat = 'json'): Logger {
  const pretty = format === 'pretty' || (format === 'auto' && process.stderr.isTTY === true);
  // ISO time, as the access log writes it (src/pool-request/access-log.ts): one format in every line poolgate writes.
  const options = { level, base: { service: 'poolgate' }, timestamp: pino.stdTimeFunctions.isoTime };
  if (!pretty) return pino(options, pino.destination({ fd: 2, sync: false }));
  // Service log lines are few (not the access log): a synchronous write per line keeps their order with stderr's.
  return pino(options, { write: (line: string) => void process.stderr.write(prettyLine(line)) });
}
