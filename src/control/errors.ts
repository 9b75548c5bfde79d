// Control API failures as values: each carries its HTTP status; the body is always `{ message }`.

export class ApiError extends Error {
  override name = 'ApiError';
  constructor(
    readonly statusCode: number,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export const unauthorized = (message = 'missing or invalid API token') => new ApiError(401, message);
export const forbidden = (message: string) => new ApiError(403, message);
export const notFound = (what: string) => new ApiError(404, `${what} not found`);
export const unprocessable = (message: string) => new ApiError(422, message);
export const unavailable = (message: string) => new ApiError(503, message);

/** PostgreSQL unique_violation, raised by a racing insert that validation could not foresee. */
export function isUniqueViolation(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: string }).code === '23505';
}
