// @vitest-environment node
import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import {
  graphqlEnvPath,
  renderGraphqlEnv,
  renderRouteTree,
  renderSchemaJson,
  routeTreePath,
  schemaJsonPath,
} from '../scripts/codegen';

// Generated files are committed; when one drifts from what its source makes now, `pnpm generate` was not run.
describe('generated files', () => {
  it('src/routeTree.gen.ts matches a fresh generation from src/routes', async () => {
    const committed = await readFile(routeTreePath, 'utf8');
    expect(committed, 'src/routeTree.gen.ts is stale: run pnpm --filter @hangar/web generate').toBe(
      await renderRouteTree(),
    );
  }, 30_000);

  it('src/generated/schema.json matches server/schema.graphql', async () => {
    const committed = await readFile(schemaJsonPath, 'utf8');
    expect(committed, 'src/generated/schema.json is stale: run pnpm --filter @hangar/web generate').toBe(
      await renderSchemaJson(),
    );
  });

  it("src/graphql-env.d.ts (gql.tada's types for every document) matches server/schema.graphql", async () => {
    const committed = await readFile(graphqlEnvPath, 'utf8');
    expect(committed, 'src/graphql-env.d.ts is stale: run pnpm --filter @hangar/web generate').toBe(
      await renderGraphqlEnv(),
    );
  }, 60_000);
});
