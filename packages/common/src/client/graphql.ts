import { initGraphQLTada } from 'gql.tada';
import type { introspection } from './graphql-env.d.ts';

// The one `graphql()` the CLI and the node agent write their operations with: each document is checked against
// server/schema.graphql by tsc, and its result and variables are typed from it, so a renamed field fails the
// build here rather than a node in the field. graphql-env.d.ts is generated (`pnpm generate`) and committed.
export const graphql = initGraphQLTada<{
  introspection: introspection;
  // A fragment here is a list of fields shared by a command's documents, not a component's private data, so
  // results are read whole rather than through readFragment.
  disableMasking: true;
  scalars: {
    // Sent as JSON numbers (exact to 2^53), as schema/scalars.ts serializes them.
    Bytes: number;
    Count: number;
    DateTime: string;
    JSON: unknown;
  };
}>();

export type { FragmentOf, ResultOf, VariablesOf } from 'gql.tada';
export { readFragment } from 'gql.tada';
