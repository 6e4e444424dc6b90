// `pnpm build` (server): bundles the server's and the CLI's entry points into dist/ (the node agent builds in its
// own package, packages/agent), so production starts run
// JavaScript instead of compiling TypeScript through tsx at every start (2 s of a 2.3 s start, measured in
// bench/start.ts). Dependencies stay external: node_modules is installed beside dist, and native or wasm parts
// (Prisma's query compiler, node-llama-cpp, argon2) are loaded from there as they are under tsx.
// Plain JavaScript, so that `pnpm start` can run it (and ask whether it is needed) without tsx.
import { existsSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';
import { bundleCommon, sourceUrls } from '../../packages/common/build/esbuild-plugins.mjs';
import { hashServerInputs, serverStampName } from './server-stamp.mjs';

const serverDir = fileURLToPath(new URL('..', import.meta.url));
export const distDir = path.join(serverDir, 'dist');

/**
 * OpenTelemetry's SDK is loaded only when tracing is on (app.ts imports telemetry/tracing.ts dynamically). A
 * bundle would inline it and hoist the SDK's imports to the top, 0.3 s of every start; as an entry of its own
 * (dist/telemetry.js), the dynamic import stays one.
 * @type {import('esbuild').Plugin}
 */
const lazyTelemetry = {
  name: 'hangar-lazy-telemetry',
  setup(b) {
    b.onResolve({ filter: /^\.\/telemetry\/tracing\.js$/ }, (args) =>
      args.kind === 'dynamic-import' ? { path: './telemetry.js', external: true } : undefined,
    );
  },
};

/** Builds dist/main.js (the server) and dist/cli.js, then stamps dist. */
export async function buildServer() {
  // Hashed before building: a source edited during the build makes the next start build again.
  const hash = await hashServerInputs(serverDir);
  // Built aside and swapped in, so a server started from dist (or a second build at the same time: the tests
  // build in parallel) never finds half a bundle. Same depth as dist: sourceUrls' paths hold for both.
  const next = path.join(serverDir, `.dist-${process.pid}-${Date.now()}`);
  await build({
    absWorkingDir: serverDir,
    entryPoints: {
      main: 'src/main.ts',
      // `hangar <command>` (bin/hangar.mjs runs dist/cli.js when it is there).
      ...(existsSync(path.join(serverDir, 'src/cli/run.ts')) ? { cli: 'src/cli/run.ts' } : {}),
      telemetry: 'src/telemetry/tracing.ts',
    },
    outdir: next,
    bundle: true,
    // No shared chunks: the import.meta.url rewrite is computed from dist/ itself, where both bundles lie.
    format: 'esm',
    platform: 'node',
    target: 'node20.19',
    packages: 'external',
    sourcemap: true,
    // Stack traces in logs then name the TypeScript file and line (node --enable-source-maps).
    sourcesContent: false,
    logLevel: 'warning',
    // The migrations and the hashing worker are read beside dist as under tsx (same depth for `next`).
    plugins: [
      bundleCommon,
      sourceUrls(distDir, /[\\/](server|packages[\\/]common)[\\/]src[\\/].*\.ts$/),
      lazyTelemetry,
    ],
  }).catch(async (err) => {
    await rm(next, { recursive: true, force: true });
    throw err;
  });
  await writeFile(path.join(next, serverStampName), `${hash}\n`);
  const old = `${next}-old`;
  // Another build may swap its own in between our two renames; then ours goes in over it.
  for (let attempt = 0; ; attempt++) {
    await rename(distDir, `${old}${attempt}`).catch(() => undefined);
    try {
      await rename(next, distDir);
      break;
    } catch (err) {
      if (attempt >= 3) throw err;
    }
  }
  for (let attempt = 0; attempt <= 3; attempt++) await rm(`${old}${attempt}`, { recursive: true, force: true });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const started = performance.now();
  await buildServer();
  process.stdout.write(`built the server into dist/ in ${Math.round(performance.now() - started)} ms\n`);
}
