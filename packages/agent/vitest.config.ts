import { createRequire } from 'node:module';
import { defineConfig } from 'vitest/config';

// graphql 16 has no exports map: Node (and so tsx, and graphql-ws) loads its CommonJS build, while Vite's
// resolver would hand the tests its ESM build, and two copies cannot share a schema. The tests load Node's.
const graphql = createRequire(import.meta.url).resolve('graphql');

export default defineConfig({
  resolve: { alias: [{ find: /^graphql$/, replacement: graphql }] },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores here and in CI: more workers only fight over them; llama.cpp contexts want the memory too.
    maxWorkers: 2,
  },
});
