#!/usr/bin/env node
// `hangar` runs the server; `hangar agent` runs the node agent (its own package, packages/agent, which a checkout
// links beside the server). The server and the CLI each run their bundle in dist/ (`pnpm build`)
// when that is the build of the sources as they are now, and otherwise the TypeScript through tsx: a checkout
// with edits never runs yesterday's bundle. An image ships dist without the sources; dist is then what there is.
import { existsSync } from 'node:fs';
import { checkServerBuild } from '../scripts/server-stamp.mjs';

/** @param {string} dist @param {string} src */
async function run(dist, src) {
  const serverDir = new URL('..', import.meta.url).pathname;
  if (!existsSync(new URL(src, import.meta.url)) || (await checkServerBuild(serverDir)).current) {
    // A build runs as production (scripts/start.mjs says why), unless the operator's NODE_ENV says otherwise.
    process.env.NODE_ENV ??= 'production';
    await import(dist);
  } else {
    const { register } = await import('tsx/esm/api');
    register();
    await import(src);
  }
}

const [command = 'server'] = process.argv.slice(2);
if (command === 'agent') {
  try {
    await import('@hangar/agent/bin');
  } catch (err) {
    if (/** @type {{ code?: string }} */ (err).code !== 'ERR_MODULE_NOT_FOUND') throw err;
    process.stderr.write(
      'the node agent is its own package (@hangar/agent), not installed beside this server: run it from a checkout ' +
        '(pnpm agent) or its image (Dockerfile.agent)\n',
    );
    process.exit(2);
  }
} else if (command === 'server') await run('../dist/main.js', '../src/main.ts');
// Moves a `file` mirror into a bucket with the server stopped: it opens the database itself, as the server does.
else if (command === 'mirror' && process.argv[3] === 'migrate')
  await run('../dist/mirror-migrate.js', '../src/mirror/migrate-main.ts');
// Every other command is the CLI (docs/cli.md); a build without its bundle runs its TypeScript.
else if (existsSync(new URL('../dist/cli.js', import.meta.url))) await run('../dist/cli.js', '../src/cli/run.ts');
else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli/run.ts');
}
