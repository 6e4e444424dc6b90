import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { gql, isRunning, kill, type ServerProcess, startServer, until } from './fixtures/server-process.js';

// HANGAR_WORKERS=2 as an operator runs it: the real server started as `pnpm start` starts it, on the embedded
// PostgreSQL, seen from outside: the processes it runs, what it prints, which process answers each request (the
// workers' log lines carry their number, and each answer's x-request-id names its line), /metrics, a worker
// killed with SIGKILL, and the stop.

const SERVER_DIR = path.resolve(import.meta.dirname, '..');
let dataDir: string;
let server: ServerProcess;

type Line = { level: string; msg: string; worker?: number; pid?: number; requestId?: string; path?: string };
const lines = (): Line[] =>
  server.output
    .join('')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
const text = () => server.output.join('');
const count = (haystack: string, needle: string) => haystack.split(needle).length - 1;

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/** PostgreSQL postmasters running on this data dir (a backend's command line is rewritten: only the postmaster's keeps -D). */
const postmasters = () =>
  readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
        return path.basename(argv[0] ?? '') === 'postgres' && argv.includes(path.join(dataDir, 'pg'));
      } catch {
        return false; // gone meanwhile
      }
    })
    .map(Number);

/** The workers the primary says it started, newest last (one that failed to start is started again: a new one). */
const started = () => lines().filter((l) => l.msg === 'started a worker');
/** Those of them running now. */
const running = () => started().filter((w) => alive(w.pid as number));

/** One request on a connection of its own (the workers take connections in turn), and its x-request-id. */
const fresh = (url: string, headers: Record<string, string> = {}, body?: string) =>
  new Promise<{ status: number; requestId: string; body: string }>((resolve, reject) => {
    const req = http.request(url, { agent: false, method: body ? 'POST' : 'GET', headers }, (res) => {
      let data = '';
      res.on('data', (d) => (data += d));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, requestId: String(res.headers['x-request-id']), body: data }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });

/** Which worker wrote each request's debug line ('request', with its id), for the ids given. */
const answeredBy = async (ids: string[]) =>
  until(
    'every request logged',
    async () => {
      const by = new Map(lines().flatMap((l) => (l.msg === 'request' && l.requestId ? [[l.requestId, l.worker]] : [])));
      return ids.every((id) => by.has(id)) ? ids.map((id) => by.get(id)) : undefined;
    },
    10_000,
  );

beforeAll(async () => {
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  dataDir = path.join(os.tmpdir(), `hangar-workers-${process.pid}-${randomBytes(3).toString('hex')}`);
  await fs.mkdir(dataDir, { recursive: true, mode: 0o755 });
  server = await startServer(
    {
      HANGAR_WORKERS: '2',
      HANGAR_DATA_DIR: dataDir,
      HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
      HANGAR_HUB_URL: 'off',
      // Set and empty is unset: the first admin gets a generated password, printed.
      HANGAR_ADMIN_EMAIL: '',
      HANGAR_ADMIN_PASSWORD: '',
      // The 'request' lines, which say which worker answered.
      HANGAR_LOG_LEVEL: 'debug',
    },
    120_000,
  );
  await until('the ready line', async () => (text().includes('Hangar is ready') ? true : undefined), 120_000);
}, 150_000);

afterAll(async () => {
  if (server) await kill(server, 'SIGKILL');
  for (const pid of dataDir ? postmasters() : []) process.kill(pid, 'SIGQUIT');
  for (const w of server ? started() : []) if (w.pid && alive(w.pid)) process.kill(w.pid, 'SIGKILL');
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

describe('HANGAR_WORKERS=2 on the embedded PostgreSQL', () => {
  it('starts one PostgreSQL and two workers, prints the first password once and says ready once', async () => {
    // A worker that printed its own ready line would have done so by now.
    await new Promise((r) => setTimeout(r, 500));
    expect(count(text(), 'password:')).toBe(1);
    expect(count(text(), 'Hangar is ready')).toBe(1);
    expect(text().indexOf('Hangar is ready')).toBeGreaterThan(text().indexOf('password:'));
    expect(postmasters()).toHaveLength(1);
    expect(running()).toHaveLength(2);
  });

  it('answers requests in both workers, and /metrics counts the requests both served', async () => {
    const password = /password: +(\S+)/.exec(text())?.[1] as string;
    const login = await gql(
      server.base,
      'mutation($e: String!, $p: String!) { login(email: $e, password: $p) { __typename ... on LoginPayload { csrfToken } } }',
      { e: 'admin@hangar.local', p: password },
      {},
    );
    const cookie = login.headers
      .getSetCookie()
      .map((c) => c.split(';')[0])
      .join('; ');
    const made = await gql(
      server.base,
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret } } }',
      { i: { name: 'workers', role: 'OPERATOR' } },
      { cookie, 'x-hangar-csrf': login.data.login.csrfToken },
    );
    const token = made.data.createApiToken.secret as string;

    const QUERIES = 12;
    const answers = [];
    for (let i = 0; i < QUERIES; i++) {
      answers.push(
        await fresh(
          `${server.base}/graphql`,
          { 'content-type': 'application/json', authorization: `Bearer ${token}` },
          JSON.stringify({ query: '{ __typename }' }),
        ),
      );
    }
    expect(answers.map((a) => a.status)).toEqual(Array(QUERIES).fill(200));
    const workers = await answeredBy(answers.map((a) => a.requestId));
    expect(new Set(workers)).toEqual(new Set(running().map((w) => w.worker)));

    // Each scrape reaches one worker or the other; every one counts all the queries, whichever worker ran them.
    for (let scrape = 0; scrape < 4; scrape++) {
      const metrics = await fresh(`${server.base}/metrics`, { authorization: `Bearer ${token}` });
      expect(metrics.status).toBe(200);
      const counted = metrics.body
        .split('\n')
        .find(
          (l) =>
            l.startsWith('graphql_envelop_request{') &&
            l.includes('operationType="query"') &&
            l.includes('operationName="other"'),
        );
      expect(
        counted,
        metrics.body
          .split('\n')
          .filter((l) => l.startsWith('graphql'))
          .join('\n'),
      ).toMatch(new RegExp(` ${QUERIES}$`));
      // Figures every worker reads alike from the database are given once, not summed.
      expect(metrics.body).toMatch(/^hangar_metrics_database_up 1$/m);
    }
  }, 60_000);

  it('restarts a worker killed with SIGKILL, while the other goes on answering', async () => {
    const [victim, survivor] = running();
    process.kill(victim?.pid as number, 'SIGKILL');
    await until(
      'the primary saying the worker died',
      async () => (lines().some((l) => l.msg.startsWith('a worker exited unexpectedly')) ? true : undefined),
      10_000,
    );
    // Before the new worker listens, every connection is the survivor's.
    const during = [];
    for (let i = 0; i < 6; i++) during.push(await fresh(`${server.base}/healthz`));
    expect(during.map((a) => a.status)).toEqual(Array(6).fill(200));
    const before = lines().filter((l) => l.msg === 'the restarted worker listens').length;
    if (!before) expect(new Set(await answeredBy(during.map((a) => a.requestId)))).toEqual(new Set([survivor?.worker]));

    const restarted = await until(
      'the restarted worker listening',
      async () => lines().find((l) => l.msg === 'the restarted worker listens'),
      60_000,
    );
    expect(running().map((w) => w.worker)).toEqual([survivor?.worker, restarted.worker]);
    const after = [];
    for (let i = 0; i < 6; i++) after.push(await fresh(`${server.base}/healthz`));
    expect(new Set(await answeredBy(after.map((a) => a.requestId)))).toEqual(
      new Set([survivor?.worker, restarted.worker]),
    );
  }, 90_000);

  it('stops every worker and then PostgreSQL on SIGTERM, and exits 0', async () => {
    const workers = running();
    expect(workers).toHaveLength(2);
    const database = postmasters();
    expect(database).toHaveLength(1);
    expect(await kill(server, 'SIGTERM').then(() => server.proc.exitCode)).toBe(0);
    for (const w of workers) expect(alive(w.pid as number)).toBe(false);
    expect(alive(database[0] as number)).toBe(false);
    const said = lines().map((l) => l.msg);
    expect(said.filter((m) => m === 'Hangar stopped')).toHaveLength(2);
    expect(said.lastIndexOf('stopped the embedded PostgreSQL')).toBeGreaterThan(said.indexOf('every worker stopped'));
    expect(lines().filter((l) => l.level === 'error' && !l.msg.startsWith('a worker exited unexpectedly'))).toEqual([]);
  }, 90_000);
});

describe('HANGAR_WORKERS=2 and Ctrl-C', () => {
  it('stops on SIGINT to the whole process group, as a terminal sends it: every worker drains once, none is restarted', async () => {
    // The same data dir, stopped cleanly above (here, when the test runs alone): its PostgreSQL starts again.
    if (isRunning(server)) await kill(server, 'SIGTERM');
    server = await startServer(
      {
        HANGAR_WORKERS: '2',
        HANGAR_DATA_DIR: dataDir,
        HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
        HANGAR_HUB_URL: 'off',
        HANGAR_LOG_LEVEL: 'info',
      },
      120_000,
      // In a process group of its own, as a terminal's foreground job (`pnpm start`) is.
      { detached: true },
    );
    await until('the ready line', async () => (text().includes('Hangar is ready') ? true : undefined), 120_000);
    const workers = running();
    expect(workers).toHaveLength(2);
    const database = postmasters();
    expect(database).toHaveLength(1);

    // What the terminal does on Ctrl-C: SIGINT to the primary and to every worker at once.
    process.kill(-(server.proc.pid as number), 'SIGINT');
    expect(await server.exited).toBe(0);
    for (const w of workers) expect(alive(w.pid as number)).toBe(false);
    expect(alive(database[0] as number)).toBe(false);
    const said = lines().map((l) => l.msg);
    expect(said.filter((m) => m === 'Hangar stopped')).toHaveLength(2);
    expect(said.filter((m) => m === 'started a worker')).toHaveLength(2);
    expect(lines().filter((l) => l.level === 'error')).toEqual([]);
    expect(said.lastIndexOf('stopped the embedded PostgreSQL')).toBeGreaterThan(said.indexOf('every worker stopped'));
  }, 150_000);
});

describe('HANGAR_WORKERS', () => {
  it('accepts a number or auto, and refuses anything else by name, saying what it accepts', async () => {
    expect(loadConfig({}).workers).toBe(1);
    expect(loadConfig({ HANGAR_WORKERS: '3' }).workers).toBe(3);
    expect(loadConfig({ HANGAR_WORKERS: 'auto' }).workers).toBe(os.availableParallelism());
    for (const bad of ['0', 'two', '1.5', '-1', '257'])
      expect(() => loadConfig({ HANGAR_WORKERS: bad })).toThrow(`HANGAR_WORKERS="${bad}" is not accepted`);

    // The server itself refuses to start, before it starts anything.
    const proc = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
      cwd: SERVER_DIR,
      env: { PATH: process.env.PATH ?? '', HANGAR_WORKERS: 'many', HANGAR_DATA_DIR: path.join(dataDir, 'unused') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    proc.stderr.on('data', (d) => (stderr += String(d)));
    const code = await new Promise((r) => proc.once('exit', r));
    expect(code).toBe(2);
    expect(stderr).toContain('HANGAR_WORKERS="many" is not accepted');
    expect(stderr).toContain('or auto for one per CPU core');
  }, 30_000);
});
