import { defineConfig } from 'vitest/config';

export default defineConfig({
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
