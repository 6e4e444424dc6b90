// @vitest-environment node
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { buildIfChanged, checkBuild, stampPlugin } from '../scripts/console-stamp.mjs';

// `pnpm start` builds the console only when what the build reads changed; here a checkout of real files in a
// temporary directory, and a build that does what Vite does to dist (empties it, writes the page).
describe('pnpm start: the console is built only when its sources changed', () => {
  let root: string;
  let webDir: string;
  let builds: string[];

  async function put(file: string, content: string) {
    await mkdir(path.dirname(path.join(webDir, file)), { recursive: true });
    await writeFile(path.join(webDir, file), content);
  }

  // What Vite does with the plugin vite.config.ts installs: hooks in the order Vite calls them.
  async function viteLikeBuild(why: string) {
    builds.push(why);
    const plugin = stampPlugin(webDir);
    await plugin.buildStart();
    await rm(path.join(webDir, 'dist'), { recursive: true, force: true });
    await put('dist/index.html', '<!doctype html><script src="/assets/main.js"></script>');
    await plugin.writeBundle({ dir: path.join(webDir, 'dist') });
  }

  beforeEach(async () => {
    root = await mkdtemp(path.join(tmpdir(), 'hangar-console-stamp-'));
    webDir = path.join(root, 'web');
    builds = [];
    await put('src/main.tsx', 'render(<App />);\n');
    await put('src/routes/mirror.tsx', 'export const Route = createFileRoute("/mirror")({});\n');
    await put('src/generated/schema.json', '{"__schema":{}}\n');
    await put('index.html', '<!doctype html><div id="root"></div>\n');
    await put('vite.config.ts', 'export default {};\n');
    await put('package.json', '{"name":"@hangar/web"}\n');
    await writeFile(path.join(root, 'pnpm-lock.yaml'), "lockfileVersion: '9.0'\n");
  });

  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('builds when there is no dist, and not again while nothing changed', async () => {
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: true, why: 'no console build yet' });
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: false });
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: false });
    expect(builds).toEqual(['no console build yet']);
  });

  it.each([
    // Same length as before: the bytes count, not only the sizes.
    ['a source edited', () => put('src/routes/mirror.tsx', 'export const Route = createFileRoute("/mirrox")({});\n')],
    ['a source added', () => put('src/routes/catalog.tsx', 'export const Route = createFileRoute("/catalog")({});\n')],
    ['a source deleted', () => rm(path.join(webDir, 'src/routes/mirror.tsx'))],
    ['the generated schema', () => put('src/generated/schema.json', '{"__schema":{"types":[]}}\n')],
    ['the page', () => put('index.html', '<!doctype html><title>Hangar</title><div id="root"></div>\n')],
    ['the Vite configuration', () => put('vite.config.ts', 'export default { base: "/" };\n')],
    ['the lockfile', () => writeFile(path.join(root, 'pnpm-lock.yaml'), "lockfileVersion: '9.1'\n")],
  ])('builds again after %s', async (_what, change) => {
    await buildIfChanged(webDir, viteLikeBuild);
    await change();
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({
      built: true,
      why: 'the console sources changed since the last build',
    });
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: false });
    expect(builds).toHaveLength(2);
  });

  it('builds again when dist was deleted, or a build left no stamp', async () => {
    await buildIfChanged(webDir, viteLikeBuild);
    await rm(path.join(webDir, 'dist'), { recursive: true });
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: true, why: 'no console build yet' });
    await rm(path.join(webDir, 'dist', '.hangar-build-stamp'));
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({
      built: true,
      why: 'the console build has no stamp',
    });
  });

  it('takes a console built by another command (`pnpm build`, the browser tests) for current', async () => {
    await viteLikeBuild('pnpm build');
    expect(await checkBuild(webDir)).toEqual({ current: true });
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: false });
  });

  it('stamps with the sources as the build started: an edit during the build builds again', async () => {
    const plugin = stampPlugin(webDir);
    await plugin.buildStart();
    await put('src/main.tsx', 'render(<App edited />);\n');
    await put('dist/index.html', '<!doctype html>');
    await plugin.writeBundle({ dir: path.join(webDir, 'dist') });
    expect(await checkBuild(webDir)).toMatchObject({
      current: false,
      why: 'the console sources changed since the last build',
    });
  });

  it('does not take a dist a failed build left half written for current, even once the edit is undone', async () => {
    await buildIfChanged(webDir, viteLikeBuild);
    await put('src/main.tsx', 'render(<App broken />);\n');
    const failing = async () => {
      await put('dist/index.html', '<!doctype html><!-- half written -->');
      throw new Error('the build failed');
    };
    await expect(buildIfChanged(webDir, failing)).rejects.toThrow('the build failed');
    await put('src/main.tsx', 'render(<App />);\n');
    expect(await buildIfChanged(webDir, viteLikeBuild)).toEqual({ built: true, why: 'the console build has no stamp' });
  });
});
