import { initGraphQLTada, type ResultOf } from 'gql.tada';
import type { introspection } from '../graphql-env.d.ts';

// The console's one `graphql()`: each document is checked against server/schema.graphql by tsc, and its result
// and variables are typed from it, so no view types a server answer by hand. src/graphql-env.d.ts is generated
// (`pnpm generate`) and committed; src/generated.test.ts fails when it drifts from the schema.
export const graphql = initGraphQLTada<{
  introspection: introspection;
  // A component's fragment is the data it reads, and its parent passes that data on as it came: fragments are
  // read whole, not masked, so graphcache's updaters and the tests' fixtures handle plain objects.
  disableMasking: true;
  scalars: {
    // Sent as JSON numbers (exact to 2^53), as the server's scalars serialize them.
    Bytes: number;
    Count: number;
    DateTime: string;
    JSON: unknown;
  };
}>();

export type { FragmentOf, ResultOf, VariablesOf } from 'gql.tada';

/**
 * One member of a field's result union, as a view keeps it after checking `__typename`:
 * `Answer<typeof LoginForm_LoginMutation, 'login', 'LoginPayload'>`.
 */
export type Answer<Doc, Field extends keyof ResultOf<Doc>, Typename extends string> = Extract<
  NonNullable<ResultOf<Doc>[Field]>,
  { __typename: Typename }
>;
export { readFragment } from 'gql.tada';
