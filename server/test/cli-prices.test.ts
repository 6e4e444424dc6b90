import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// `hangar prices ls|set` as an admin runs it: bin/hangar.mjs in a process of its own against a real Hangar.

const BIN = path.resolve(import.meta.dirname, '..', 'bin', 'hangar.mjs');

let t: TestApp;
let base: string;
let admin: string;
let home: string;

type Run = { code: number | null; stdout: string; stderr: string };

function hangar(args: string[]): Promise<Run> {
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
  const proc = spawn(process.execPath, [BIN, ...args], {
    cwd: os.tmpdir(),
    env: { ...inherited, HOME: home, HANGAR_URL: base, HANGAR_TOKEN: admin },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const run: Run = { code: null, stdout: '', stderr: '' };
  proc.stdout.on('data', (d) => {
    run.stdout += String(d);
  });
  proc.stderr.on('data', (d) => {
    run.stderr += String(d);
  });
  return new Promise((resolve) =>
    proc.once('exit', (code) => {
      run.code = code;
      resolve(run);
    }),
  );
}

beforeAll(async () => {
  home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-prices-'));
  t = await startTestApp({ HOST: '127.0.0.1' });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'cli-prices-admin');
}, 60_000);

afterAll(async () => {
  await t?.close();
  await fs.rm(home, { recursive: true, force: true });
});

it('sets, lists and removes node, GPU and model prices, and refuses a bad value or a misplaced flag saying why', async () => {
  expect((await hangar(['prices', 'ls'])).stdout).toContain('No prices');
  const node = await hangar(['prices', 'set', 'node', 'gpu-1', '--per-gpu-hour', '2.40']);
  expect(node.stderr).toBe('');
  expect(node.code).toBe(0);
  expect(node.stdout).toContain('Set the price of node gpu-1.');
  expect((await hangar(['prices', 'set', 'gpu', 'NVIDIA L4', '--per-gpu-hour', '0.8'])).code).toBe(0);
  const model = await hangar([
    'prices',
    'set',
    'model',
    'llama-8b',
    '--per-million-prompt',
    '0.15',
    '--per-million-completion',
    '0.6',
  ]);
  expect(model.code).toBe(0);

  const ls = await hangar(['prices', 'ls']);
  expect(ls.stdout).toMatch(/NODE\s+gpu-1\s+2\.40\s+-\s+-\s+USD/);
  expect(ls.stdout).toMatch(/GPU\s+NVIDIA L4\s+0\.80\s+-\s+-\s+USD/);
  expect(ls.stdout).toMatch(/MODEL\s+llama-8b\s+-\s+0\.15\s+0\.60\s+USD/);
  const json = JSON.parse((await hangar(['--json', 'prices', 'ls', '--target', 'model'])).stdout) as { name: string }[];
  expect(json.map((p) => p.name)).toEqual(['llama-8b']);
  // What the server holds is what the CLI set (and it is audited there, as through the API).
  const held = await t.app.db.prisma.price.findMany({ orderBy: { name: 'asc' } });
  expect(held.map((p) => p.name)).toEqual(['gpu-1', 'llama-8b', 'NVIDIA L4'].sort());

  const bad = await hangar(['prices', 'set', 'node', 'gpu-1', '--per-gpu-hour', 'two euros']);
  expect(bad.code).not.toBe(0);
  expect(bad.stderr).toContain('perGpuHour');
  const misplaced = await hangar(['prices', 'set', 'model', 'llama-8b', '--per-gpu-hour', '1']);
  expect(misplaced.code).not.toBe(0);
  expect(misplaced.stderr).toContain('a model is priced per million tokens');
  const what = await hangar(['prices', 'set', 'rack', 'r1', '--per-gpu-hour', '1']);
  expect(what.stderr).toContain('the target is one of node, gpu, model; "rack" is not');

  const rm = await hangar(['prices', 'set', 'node', 'gpu-1', '--remove']);
  expect(rm.code).toBe(0);
  expect(rm.stdout).toContain('Removed the price of node gpu-1.');
  expect((await hangar(['prices', 'ls', '--target', 'node'])).stdout).toContain('No prices');
}, 60_000);
