import { tanstackRouter } from '@tanstack/router-plugin/vite';
import react from '@vitejs/plugin-react';
import { defineConfig } from 'vite';
import { stampPlugin } from './scripts/console-stamp.mjs';
import { precompressPlugin } from './scripts/precompress.mjs';

// `pnpm dev` serves the console on Vite and forwards the server's paths to a Hangar server (pnpm dev at the root
// starts both). No changeOrigin: the server accepts a WebSocket only when its Origin matches the Host it was sent to.
const target = process.env.HANGAR_DEV_SERVER ?? 'http://127.0.0.1:4000';

export default defineConfig({
  // The router plugin (reads tsr.config.json) must come before react(): it rewrites route files for code splitting.
  // stampPlugin marks dist as the build of the sources as they are, so `pnpm start` skips a build that is current.
  // precompressPlugin writes .br and .gz beside each file, which the server sends as they are (http/static.ts).
  plugins: [
    tanstackRouter({ autoCodeSplitting: true }),
    react(),
    precompressPlugin(),
    stampPlugin(import.meta.dirname),
  ],
  server: {
    proxy: {
      '/graphql': { target, ws: true },
      '/healthz': { target },
      '/readyz': { target },
      // Mirror files live under /mirror/<model>/<version>/<file>; /mirror itself is the console's page.
      '^/mirror/': { target },
      '/api/': { target },
    },
  },
  build: { outDir: 'dist', emptyOutDir: true },
});
