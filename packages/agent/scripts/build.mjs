// `pnpm --filter @hangar/agent build`: bundles the agent (and the @hangar/common code it uses) into
// dist/agent.js for images, which then ship no TypeScript and no tsx compile at start. Other dependencies stay
// external: node-llama-cpp's native parts are loaded from node_modules, as under tsx.
// Plain JavaScript, so that it runs without tsx.
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { build } from 'esbuild';
import { bundleCommon, sourceUrls } from '../../common/build/esbuild-plugins.mjs';

const agentDir = fileURLToPath(new URL('..', import.meta.url));
export const distDir = path.join(agentDir, 'dist');

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
    // The trainer (trainer/train_lora.py) and the hashing worker are found beside dist as under tsx.
    plugins: [bundleCommon, sourceUrls(distDir, /[\\/]packages[\\/](agent|common)[\\/]src[\\/].*\.ts$/)],
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const started = performance.now();
  await buildAgent();
  process.stdout.write(`built the agent into dist/ in ${Math.round(performance.now() - started)} ms\n`);
}
