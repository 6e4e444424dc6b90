import { createRequire } from 'node:module';
import { defineConfig } from 'vitest/config';

// graphql 16 has no exports map: Node (and so tsx, and every library here) loads its CommonJS build, while
// Vite's resolver would hand the tests and the sources they import its ESM build. Two copies of graphql cannot
// share a schema ("Cannot use GraphQLSchema from another module or realm"), so the tests load Node's.
const graphql = createRequire(import.meta.url).resolve('graphql');

export default defineConfig({
  resolve: { alias: [{ find: /^graphql$/, replacement: graphql }] },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // One PostgreSQL cluster for the whole run; each test file makes its own database in it.
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    teardownTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores here and in CI: more workers only fight over them.
    maxWorkers: 2,
  },
});
