// A budget: an origin's concurrency shared by several pools (spec: "Budgets").
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const Nullable = <T extends TSchema>(s: T) => Type.Union([s, Type.Null()]);

export const Budget = Type.Object(
  {
    id: Type.Integer(),
    name: Type.String(),
    pool_ids: Type.Array(Type.Integer()),
    origin_max_concurrent: Nullable(Type.Integer()),
    unallocated: Type.Integer(),
  },
  { $id: 'Budget', additionalProperties: false },
);

export type BudgetT = Static<typeof Budget>;
