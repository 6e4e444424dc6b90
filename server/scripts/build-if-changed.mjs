// `pnpm start`'s server step, as web/scripts/build-if-changed.mjs is its console step: bundles the server only
// when its sources changed since the last build, so a start with nothing changed runs dist/ at once.
import { fileURLToPath } from 'node:url';
import { checkServerBuild } from './server-stamp.mjs';

const serverDir = fileURLToPath(new URL('..', import.meta.url));
const check = await checkServerBuild(serverDir);
if (check.current) {
  process.stdout.write('the server is current: not rebuilt\n');
} else {
  process.stdout.write(`building the server: ${check.why}\n`);
  try {
    // Imported only to build: esbuild's loading is a tenth of a second of every `pnpm start` otherwise.
    const { buildServer } = await import('./build.mjs');
    await buildServer();
  } catch (err) {
    // esbuild has printed where. The old dist stays, stamped for older sources: bin/hangar.mjs will not run it.
    process.stderr.write(`the server's build failed: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}
