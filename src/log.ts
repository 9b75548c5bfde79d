// The service log: pino JSON lines on stderr (stdout carries only the machine-readable `listening` line).
import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string): Logger {
  return pino({ level, base: { service: 'poolgate' } }, pino.destination({ fd: 2, sync: false }));
}
