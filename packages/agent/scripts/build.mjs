// `pnpm --filter @hangar/agent build`: bundles the agent (and the @hangar/common code it uses) into
// dist/agent.js for images, which then ship no TypeScript and no tsx compile at start. Other dependencies stay
// external: node-llama-cpp's native parts are loaded from node_modules, as under tsx.
// Plain JavaScript, so that it runs without tsx.
import { readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';

const agentDir = fileURLToPath(new URL('..', import.meta.url));
const commonDir = path.resolve(agentDir, '../common');
export const distDir = path.join(agentDir, 'dist');

/**
 * Files reach things beside them through `new URL(…, import.meta.url)`: the trainer (trainer/train_lora.py),
 * the hashing worker (common/src/download/sha256-worker.cjs), package.json. In one bundle every file would share
 * the bundle's URL; this rewrites each file's import.meta.url to its source file's, computed from dist/, so each
 * such path means what it means under tsx (and the image copies those files to the same places).
 * @type {import('esbuild').Plugin}
 */
const sourceUrls = {
  name: 'hangar-source-urls',
  setup(b) {
    b.onLoad({ filter: /[\\/]packages[\\/](agent|common)[\\/]src[\\/].*\.ts$/ }, async (args) => {
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

/**
 * `packages: 'external'` would leave @hangar/common to Node, which cannot load its TypeScript: it is bundled,
 * resolved through its exports map (`@hangar/common/x` is common/src/x.ts). The packages common imports are then
 * imported by the bundle, from this package's node_modules, so they are listed in this package.json too.
 * @type {import('esbuild').Plugin}
 */
const bundleCommon = {
  name: 'hangar-bundle-common',
  setup(b) {
    b.onResolve({ filter: /^@hangar\/common\// }, (args) => ({
      path: path.join(commonDir, 'src', `${args.path.slice('@hangar/common/'.length)}.ts`),
    }));
  },
};

export async function buildAgent() {
  await rm(distDir, { recursive: true, force: true });
  await build({
    absWorkingDir: agentDir,
    entryPoints: { agent: 'src/main.ts' },
    outdir: distDir,
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node20.19',
    packages: 'external',
    sourcemap: true,
    sourcesContent: false,
    logLevel: 'warning',
    plugins: [bundleCommon, sourceUrls],
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const started = performance.now();
  await buildAgent();
  process.stdout.write(`built the agent into dist/ in ${Math.round(performance.now() - started)} ms\n`);
}
