// What an API token or dashboard session may do (spec: "Abilities"). The store grants them by role;
// the Control API checks them per route.
export const ABILITIES = ['budgets:read', 'pools:read', 'pools:write', 'keys:write', 'metrics:read'] as const;
export type Ability = (typeof ABILITIES)[number];
