// Control API failures as values: each carries a catalogue code (src/errors/catalogue.ts), which gives its
// HTTP status; the body is always `{ message }` (spec: the Control API's Error has no code field).
import { httpStatus, type HttpCode } from '../errors/catalogue.js';

export class ApiError extends Error {
  override name = 'ApiError';
  readonly statusCode: number;
  constructor(
    readonly code: HttpCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.statusCode = httpStatus(code);
  }
}

export const unauthorized = (message = 'missing or invalid API token') => new ApiError('unauthorized', message);
export const forbidden = (message: string) => new ApiError('forbidden', message);
export const notFound = (what: string) => new ApiError('not_found', `${what} not found`);
export const unprocessable = (message: string) => new ApiError('unprocessable', message);
export const unavailable = (message: string) => new ApiError('unavailable', message);

/** PostgreSQL unique_violation, raised by a racing insert that validation could not foresee. */
export function isUniqueViolation(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: string }).code === '23505';
}
