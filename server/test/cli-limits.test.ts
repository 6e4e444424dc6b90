import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// `hangar limits ls|set|rm` as an admin runs it: bin/hangar.mjs in a process of its own against a real Hangar.

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
  home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-limits-'));
  t = await startTestApp({ HOST: '127.0.0.1' });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'cli-limits-admin');
}, 60_000);

afterAll(async () => {
  await t?.close();
  await fs.rm(home, { recursive: true, force: true });
});

it('sets, lists and removes a limit, and refuses a bad scope or value saying why', async () => {
  expect((await hangar(['limits', 'ls'])).stdout).toContain('No limits');
  const set = await hangar(['limits', 'set', 'user:admin@example.com', '--rpm', '120', '--tokens-per-day', '50000']);
  expect(set.stderr).toBe('');
  expect(set.code).toBe(0);
  expect(set.stdout).toContain('Set limits on user:admin@example.com.');
  const ls = await hangar(['limits', 'ls']);
  expect(ls.stdout).toMatch(/user:admin@example\.com\s+\*\s+requestsPerMinute\s+120\s+0\s+120/);
  expect(ls.stdout).toMatch(/tokensPerDay\s+50000/);
  const bad = await hangar(['limits', 'set', 'team:nobody/none', '--rpm', '1']);
  expect(bad.code).not.toBe(0);
  expect(bad.stderr).toContain('scope');
  const negative = await hangar(['limits', 'set', 'user:admin@example.com', '--rpm', '-3']);
  expect(negative.code).not.toBe(0);
  expect(negative.stderr).toContain('--rpm: a number of at least 0');
  const rm = await hangar(['limits', 'rm', 'user:admin@example.com']);
  expect(rm.code).toBe(0);
  expect((await hangar(['limits', 'ls'])).stdout).toContain('No limits');
}, 60_000);
