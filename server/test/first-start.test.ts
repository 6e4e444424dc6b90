import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { freePort } from '@hangar/common/free-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import { freshDatabase } from './harness.js';

// The first minutes of a new install, as `pnpm start` shows them: the server started as a person starts it, with
// no admin password set, prints the generated password and, beside it in plain words on stdout, the address to
// open (until now only in a JSON log line). The password works at that address.

const SERVER_DIR = path.resolve(import.meta.dirname, '..');
let database: Database;
let dataDir: string;
let proc: ChildProcess | undefined;

beforeAll(async () => {
  database = await freshDatabase();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-first-start-'));
});

afterAll(async () => {
  if (proc && proc.exitCode === null) {
    const ended = new Promise((r) => proc?.once('exit', r));
    proc.kill('SIGTERM');
    await ended;
  }
  await database?.close();
  await fs.rm(dataDir, { recursive: true, force: true });
});

it('prints the address to open next to the first admin password, and the password signs in there', async () => {
  const port = await freePort();
  const { HANGAR_ADMIN_PASSWORD: _p, HANGAR_ADMIN_EMAIL: _e, HANGAR_PUBLIC_URL: _u, ...inherited } = process.env;
  proc = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
    cwd: SERVER_DIR,
    env: {
      ...inherited,
      DATABASE_URL: database.url,
      HANGAR_DATA_DIR: dataDir,
      PORT: String(port),
      HOST: '127.0.0.1',
      HANGAR_LOG_LEVEL: 'warn',
      HANGAR_HUB_URL: 'off',
      HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stdout?.on('data', (d) => (stdout += String(d)));
  proc.stderr?.on('data', (d) => (stderr += String(d)));
  const end = Date.now() + 90_000;
  while (!stdout.includes('Hangar is ready')) {
    if (proc.exitCode !== null) throw new Error(`the server exited with ${proc.exitCode}: ${stdout}${stderr}`);
    if (Date.now() > end) throw new Error(`no ready line on stdout: ${stdout}${stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const password = /password: +(\S+)/.exec(stdout)?.[1];
  expect(password, stdout).toBeTruthy();
  // Plain words on stdout, after the password: not a JSON line.
  const address = `http://127.0.0.1:${port}/`;
  expect(stdout).toContain(`Hangar is ready: open ${address} in a browser to use the console.`);
  expect(stdout.indexOf('Hangar is ready')).toBeGreaterThan(stdout.indexOf('password:'));

  const login = await fetch(`${address}graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      query:
        'mutation($e: String!, $p: String!) { login(email: $e, password: $p) { __typename ... on Error { message } } }',
      variables: { e: 'admin@hangar.local', p: password },
    }),
  });
  expect((await login.json()).data.login.__typename).toBe('LoginPayload');
}, 120_000);
