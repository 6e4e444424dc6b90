// `pnpm start`'s first step: builds the console only when its sources changed since the last build (see
// console-stamp.mjs). The build itself is web's `pnpm build`, so there is one definition of how the console is built.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { buildIfChanged } from './console-stamp.mjs';

const webDir = fileURLToPath(new URL('..', import.meta.url));

/** @param {string} why */
function build(why) {
  process.stdout.write(`building the console: ${why}\n`);
  return new Promise((resolve, reject) => {
    // pnpm is on PATH: this runs inside `pnpm start`, and the README installs pnpm first.
    const child = spawn('pnpm', ['run', 'build'], { cwd: webDir, stdio: 'inherit' });
    child.on('error', reject);
    child.on('exit', (code, signal) =>
      code === 0 ? resolve(undefined) : reject(new Error(`the console's build failed (${signal ?? `exit ${code}`})`)),
    );
  });
}

try {
  const { built } = await buildIfChanged(webDir, build);
  if (!built) process.stdout.write('the console is current: not rebuilt\n');
} catch (err) {
  // Vite has already printed what is wrong; the server is not started with a console that is not there.
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
