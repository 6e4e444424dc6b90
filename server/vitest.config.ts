import { createRequire } from 'node:module';
import { defineConfig } from 'vitest/config';

const require = createRequire(import.meta.url);

export default defineConfig({
  resolve: {
    // graphql ships CommonJS and ESM side by side. Libraries loaded by Node (Yoga, Pothos) get the ESM copy;
    // without this, our own files would get the other one, and graphql refuses to mix types from two copies.
    alias: [{ find: /^graphql$/, replacement: require.resolve('graphql').replace(/index\.js$/, 'index.mjs') }],
  },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // One PostgreSQL cluster for the whole run; each test file makes its own database in it.
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores here and in CI: more workers only fight over them.
    maxWorkers: 2,
  },
});
