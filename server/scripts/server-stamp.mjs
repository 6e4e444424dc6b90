// Whether server/dist is the build of the server's sources as they are now: the same stamp as the console's
// (web/scripts/console-stamp.mjs, whose hashing this reuses), over the server's inputs. `pnpm start` and
// bin/hangar.mjs ask before running dist, so a stale bundle is never run in place of the sources.
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { hashBuildInputs, stampName } from '../../web/scripts/console-stamp.mjs';

export const serverStampName = stampName;

/** What the bundle is made from, relative to server/: tests are in src too, which only costs a rebuild. */
export const serverInputs = [
  'src',
  '../packages/common/src',
  'package.json',
  'tsconfig.json',
  'scripts/build.mjs',
  '../pnpm-lock.yaml',
];

/** @param {string} serverDir */
export function hashServerInputs(serverDir) {
  return hashBuildInputs(serverDir, serverInputs);
}

/**
 * Current when dist holds the server's entry point and a stamp matching the sources' hash now; otherwise, why not.
 * @param {string} serverDir
 * @returns {Promise<{ current: true } | { current: false; why: string }>}
 */
export async function checkServerBuild(serverDir) {
  const dist = path.join(serverDir, 'dist');
  if (!existsSync(path.join(dist, 'main.js'))) {
    return { current: false, why: 'no server build yet' };
  }
  const stamp = await readFile(path.join(dist, serverStampName), 'utf8').catch(() => undefined);
  if (stamp === undefined) return { current: false, why: 'the server build has no stamp' };
  if (stamp.trim() !== (await hashServerInputs(serverDir))) {
    return { current: false, why: 'the server sources changed since the last build' };
  }
  return { current: true };
}
