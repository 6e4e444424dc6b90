import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { sourceMappedStack } from '@hangar/common/stack-source';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The server runs its bundle without `node --enable-source-maps` (that flag keeps every map decoded from the
// start); the log maps a stack's frames itself when it writes one. Here a bundle built as the server's is (esbuild,
// whitespace minified, a map beside it) throws in a node of its own, and its stack comes back to the source.

let dir: string;
let bundle: string;
/** The same bundle as a package would have it, under node_modules. */
let packaged: string;
// The line `fail` throws on, and the one that calls it.
const THROW_LINE = 4;
const CALL_LINE = 8;

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-stack-source-'));
  const source = path.join(dir, 'thrower.ts');
  await fs.writeFile(
    source,
    [
      '// a comment — not ASCII, as in the server',
      'type Why = { because: string };',
      'export function fail(why: Why): never {',
      "  throw new Error('failed: ' + why.because);",
      '}',
      'try {',
      '  const why: Why = { because: "it must" };',
      '  fail(why);',
      '} catch (err) {',
      '  process.stdout.write((err as Error).stack ?? "");',
      '}',
      '',
    ].join('\n'),
  );
  bundle = path.join(dir, 'dist', 'thrower.js');
  packaged = path.join(dir, 'node_modules', 'thrower', 'dist', 'thrower.js');
  for (const outfile of [bundle, packaged]) {
    await build({
      entryPoints: [source],
      outfile,
      bundle: true,
      format: 'esm',
      platform: 'node',
      sourcemap: true,
      sourcesContent: false,
      minifyWhitespace: true,
      logLevel: 'silent',
    });
  }
});
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

function stackOfBundle(file = bundle): string {
  const run = spawnSync(process.execPath, [file], { encoding: 'utf8' });
  expect(run.status, run.stderr).toBe(0);
  return run.stdout;
}

describe("a bundle's stack in the log", () => {
  it('names the TypeScript file, line and column of each frame in the bundle', () => {
    const stack = stackOfBundle();
    // As node prints it: the bundle's own place, line 1 of a minified file.
    expect(stack).toMatch(/thrower\.js:1:\d+/);
    const mapped = sourceMappedStack(stack);
    const source = path.join(dir, 'thrower.ts');
    expect(mapped).toContain('Error: failed: it must');
    expect(mapped).toContain(`${source}:${THROW_LINE}:`);
    expect(mapped).toContain(`${source}:${CALL_LINE}:`);
    expect(mapped).not.toMatch(/thrower\.js:1:/);
  });

  it("leaves frames of files without a map (Node's own) as they were", () => {
    const mapped = sourceMappedStack(stackOfBundle());
    const nodeFrames = (s: string) => s.split('\n').filter((l) => l.includes('node:internal'));
    expect(nodeFrames(mapped).length).toBeGreaterThan(0);
    expect(nodeFrames(mapped)).toEqual(nodeFrames(stackOfBundle()));
  });

  it("leaves a package's frames as Node names them, map or not (a package's map can be megabytes)", () => {
    const stack = stackOfBundle(packaged);
    expect(stack).toMatch(/node_modules\/thrower\/dist\/thrower\.js:1:\d+/);
    expect(sourceMappedStack(stack)).toBe(stack);
  });

  it("leaves the message alone, though it quotes a bundle's place (a caller's text is not a frame)", () => {
    const stack = stackOfBundle();
    const quoted = `Error: no such file ${bundle}:1:20\n${stack.split('\n').slice(1).join('\n')}`;
    const mapped = sourceMappedStack(quoted);
    expect(mapped.split('\n')[0]).toBe(`Error: no such file ${bundle}:1:20`);
    expect(mapped).toContain(`thrower.ts:${THROW_LINE}:`);
  });

  it("is how the logger writes an error's stack", () => {
    const lines: string[] = [];
    const error = new Error('failed');
    error.stack = stackOfBundle();
    createLogger('info', (l) => lines.push(l)).error('it failed', { error });
    const logged = JSON.parse(lines[0] ?? '{}') as { error: { stack: string } };
    expect(logged.error.stack).toContain(`thrower.ts:${THROW_LINE}:`);
  });
});
