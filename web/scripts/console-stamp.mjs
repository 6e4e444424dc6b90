// Whether web/dist is the build of the console's sources as they are now. `pnpm start` asks before building, so
// a start with nothing changed skips a Vite build of several seconds; `pnpm build` and the browser tests still
// build every time. The stamp is a hash of what the build reads, written into dist by every Vite build that
// succeeds (stampPlugin), so a console built by `pnpm build` or the browser tests counts as current too.
// Plain JavaScript (type-checked through JSDoc): Node runs it as it is, without tsx, whose loader alone adds
// 0.2–0.4 s to every start.
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';

/** Inside dist, so that deleting dist (or Vite emptying it) forgets the stamp with the build it described. */
export const stampName = '.hangar-build-stamp';

/**
 * What a build of the console reads, relative to web/: its sources (the generated schema.json and route tree
 * included), its page, its build configuration, and the lockfile, since a dependency upgrade changes the bundle
 * without touching a source. A path that is missing counts as missing, so adding it later changes the hash.
 */
export const buildInputs = [
  'src',
  'index.html',
  'vite.config.ts',
  'tsr.config.json',
  'tsconfig.json',
  'package.json',
  '../pnpm-lock.yaml',
];

/**
 * Every file under dir, or undefined when dir is no directory.
 * @param {string} dir
 * @returns {Promise<string[] | undefined>}
 */
async function listFiles(dir) {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true }).catch(() => undefined);
  if (!entries) return undefined;
  return entries
    .filter((e) => e.isFile())
    .map((e) => path.join(e.parentPath, e.name))
    .sort();
}

/**
 * A hash of every build input's path and bytes; the same sources give the same hash on any machine.
 * @param {string} webDir
 * @param {readonly string[]} [inputs]
 * @returns {Promise<string>}
 */
export async function hashBuildInputs(webDir, inputs = buildInputs) {
  const hash = createHash('sha256');
  for (const input of inputs) {
    const full = path.resolve(webDir, input);
    const files = (await listFiles(full)) ?? (existsSync(full) ? [full] : []);
    if (!files.length) hash.update(`missing\0${input}\0`);
    for (const file of files) {
      const content = await readFile(file);
      // Path and length before the bytes, so moving bytes from one file into the next changes the hash too.
      hash.update(`${path.relative(webDir, file).split(path.sep).join('/')}\0${content.length}\0`);
      hash.update(content);
    }
  }
  return hash.digest('hex');
}

/** @typedef {{ current: true } | { current: false; why: string; hash: string }} BuildCheck */

/**
 * Current when dist holds a page and a stamp matching the sources' hash now; otherwise, why not.
 * @param {string} webDir
 * @param {string} [distDir]
 * @returns {Promise<BuildCheck>}
 */
export async function checkBuild(webDir, distDir = path.join(webDir, 'dist')) {
  const hash = await hashBuildInputs(webDir);
  if (!existsSync(path.join(distDir, 'index.html'))) return { current: false, why: 'no console build yet', hash };
  const stamp = await readFile(path.join(distDir, stampName), 'utf8').catch(() => undefined);
  if (stamp === undefined) return { current: false, why: 'the console build has no stamp', hash };
  if (stamp.trim() !== hash) return { current: false, why: 'the console sources changed since the last build', hash };
  return { current: true };
}

/**
 * Builds when the check says so; the build stamps dist itself (stampPlugin).
 * @param {string} webDir
 * @param {(why: string) => Promise<void>} build
 * @param {string} [distDir]
 * @returns {Promise<{ built: boolean; why?: string }>}
 */
export async function buildIfChanged(webDir, build, distDir = path.join(webDir, 'dist')) {
  const check = await checkBuild(webDir, distDir);
  if (check.current) return { built: false };
  // A build that fails halfway must not leave the old stamp beside a partial dist.
  await rm(path.join(distDir, stampName), { force: true });
  await build(check.why);
  return { built: true, why: check.why };
}

/**
 * The Vite plugin that stamps every successful build, whichever command ran it. The hash is taken when the build
 * starts: a source edited while Vite runs then makes the next start build again, rather than a stamp vouching for
 * a bundle made from older sources. writeBundle runs only once every file is written; a build that fails after
 * Vite emptied dist leaves no stamp, and one that fails before leaves the old stamp beside the old bundle it
 * describes.
 * @param {string} webDir
 */
export function stampPlugin(webDir) {
  /** @type {string | undefined} */
  let hash;
  return {
    name: 'hangar-console-stamp',
    /** @type {'build'} */
    apply: 'build',
    async buildStart() {
      hash = await hashBuildInputs(webDir);
    },
    /** @param {{ dir?: string }} output */
    async writeBundle(output) {
      if (hash) await writeFile(path.join(output.dir ?? path.join(webDir, 'dist'), stampName), `${hash}\n`);
    },
  };
}
