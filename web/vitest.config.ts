import react from '@vitejs/plugin-react';
import { defineConfig } from 'vitest/config';

// Tests do not load the router plugin: the route tree is checked against a fresh generation instead.
export default defineConfig({
  plugins: [react()],
  test: {
    environment: 'jsdom',
    setupFiles: ['./src/test/setup.ts'],
    include: ['src/**/*.test.{ts,tsx}'],
  },
});
