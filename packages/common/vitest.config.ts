import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    testTimeout: 30_000,
    // Two cores here and in CI: more workers only fight over them.
    maxWorkers: 2,
  },
});
