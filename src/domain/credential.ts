// How poolgate authenticates to a pool's origin with the credential it holds (spec: "Credentials").
export const AUTH_METHODS = ['bearer_static', 'api_key', 'basic', 'postgres_role'] as const;
export type AuthMethod = (typeof AUTH_METHODS)[number];
