// The esbuild plugins the server's and the agent's bundles share (server/scripts/build.mjs and
// packages/agent/scripts/build.mjs). Plain JavaScript, so that the build scripts run without tsx.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const commonSrc = fileURLToPath(new URL('../src', import.meta.url));

/**
 * Files reach things beside them through `new URL(…, import.meta.url)`: the migrations, the trainer, the hashing
 * worker (common/src/download/sha256-worker.cjs), package.json. In one bundle every file would share the bundle's
 * URL and those paths would point a folder or two off. This rewrites each matching file's import.meta.url to its
 * source file's URL, computed from `distDir` (where the bundle runs), so each such path means what it means under
 * tsx, and the tree beside dist is what is read.
 * @param {string} distDir
 * @param {RegExp} filter the source files whose import.meta.url is rewritten
 * @returns {import('esbuild').Plugin}
 */
export function sourceUrls(distDir, filter) {
  return {
    name: 'hangar-source-urls',
    setup(b) {
      b.onLoad({ filter }, async (args) => {
        const text = await readFile(args.path, 'utf8');
        if (!text.includes('import.meta.url')) return undefined;
        const rel = path.relative(distDir, args.path).split(path.sep).join('/');
        return {
          contents: text.replaceAll('import.meta.url', `new URL(${JSON.stringify(rel)}, import.meta.url).href`),
          loader: 'ts',
        };
      });
    },
  };
}

/**
 * `packages: 'external'` would leave @hangar/common to Node, which cannot load its TypeScript: it is bundled,
 * resolved as its exports map says (`@hangar/common/x` is packages/common/src/x.ts). The packages common imports
 * are then imported by the bundle, from the bundling package's node_modules, so that package lists them too.
 * @type {import('esbuild').Plugin}
 */
export const bundleCommon = {
  name: 'hangar-bundle-common',
  setup(b) {
    b.onResolve({ filter: /^@hangar\/common\// }, (args) => ({
      path: path.join(commonSrc, `${args.path.slice('@hangar/common/'.length)}.ts`),
    }));
  },
};
