import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// ~/.config/hangar holds the CLI's token. Writable by other users, it lets any of them put a credentials.json of
// their own there (or rename one over it) naming their server: the next `hangar` command sends the user's token
// to it. The CLI makes the directory 0700 and the file 0600, tightens a directory of the user's own that others
// could write (saying so), and refuses to read a token from one that others can write.

const SERVER_DIR = path.resolve(import.meta.dirname, '..');
const BIN = path.join(SERVER_DIR, 'bin', 'hangar.mjs');

let t: TestApp;
let base: string;
let operator: string;
let home: string;

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'cli-config-dir');
  // Not mkdtemp's 0700 for what the test loosens below: the home itself is the user's, as usual.
  home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-dir-'));
});
afterAll(async () => {
  await t?.close();
  if (home) await fs.rm(home, { recursive: true, force: true });
});

function hangar(args: string[], env: Record<string, string> = {}) {
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
  const proc = spawn(process.execPath, [BIN, ...args], {
    cwd: os.tmpdir(),
    env: { ...inherited, HOME: home, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (d) => (stdout += d));
  proc.stderr.on('data', (d) => (stderr += d));
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
    proc.once('exit', (code) => resolve({ code, stdout, stderr })),
  );
}

const dir = () => path.join(home, '.config', 'hangar');
const mode = async (p: string) => (await fs.stat(p)).mode & 0o777;

describe("the CLI's config directory", () => {
  it('is made 0700 with a 0600 file on a first login', async () => {
    const r = await hangar(['login', base, '--token', operator]);
    expect(r.code, r.stderr).toBe(0);
    expect(await mode(dir())).toBe(0o700);
    expect(await mode(path.join(dir(), 'credentials.json'))).toBe(0o600);
  }, 60_000);

  it('is tightened to 0700 at login when others could write it, saying why', async () => {
    await fs.chmod(dir(), 0o777);
    const r = await hangar(['login', base, '--token', operator]);
    expect(r.code, r.stderr).toBe(0);
    expect(await mode(dir())).toBe(0o700);
    expect(r.stderr).toContain(`${dir()} was writable by other users (mode 777)`);
    expect(r.stderr).toContain('now 700');
  }, 60_000);

  it('is refused, and no token is sent, when others can write it and a planted file names their server', async () => {
    // The other user's server: it would receive the token.
    const seen: string[] = [];
    const planted = http.createServer((req, res) => {
      seen.push(String(req.headers.authorization));
      res.end('{}');
    });
    await new Promise<void>((r) => planted.listen(0, '127.0.0.1', r));
    const port = (planted.address() as { port: number }).port;
    try {
      await fs.chmod(dir(), 0o777);
      // What a world-writable directory lets anyone do: rename a file of theirs over the user's.
      const theirs = path.join(dir(), 'theirs.json');
      await fs.writeFile(theirs, JSON.stringify({ url: `http://127.0.0.1:${port}`, token: (await read()).token }), {
        mode: 0o666,
      });
      await fs.rename(theirs, path.join(dir(), 'credentials.json'));
      const r = await hangar(['models']);
      expect(r.code).toBe(3);
      expect(r.stderr).toContain(`${dir()} is writable by other users (mode 777)`);
      expect(r.stderr).toContain('chmod 700');
      expect(seen).toEqual([]);
    } finally {
      await new Promise((r) => planted.close(r));
      await fs.chmod(dir(), 0o700);
    }
  }, 60_000);
});

const read = async () => JSON.parse(await fs.readFile(path.join(dir(), 'credentials.json'), 'utf8'));
