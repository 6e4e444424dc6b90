import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startEmbeddedPostgres } from '../src/db/embedded.js';
import {
  fetchInto,
  isRunning,
  kill,
  midway,
  operatorToken,
  readyz,
  type ServerProcess,
  settle,
  startServer,
  until,
} from './fixtures/server-process.js';

// The default setup, one process with its PostgreSQL under HANGAR_DATA_DIR, through what a bad night does to
// it: the PostgreSQL killed under a download (the OOM killer picks the biggest process, often the database),
// then the server itself killed with SIGKILL, which leaves that PostgreSQL running on the data dir.

const SIZE = 2 * 1024 * 1024;

let dataDir: string;
let up: Upstream;
const servers: ServerProcess[] = [];

const env = () => ({ HANGAR_DATA_DIR: dataDir, HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist') });
const lockFile = () => path.join(dataDir, 'pg', 'postmaster.pid');
const postmaster = async () => Number((await fs.readFile(lockFile(), 'utf8')).split('\n')[0]);
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

beforeAll(async () => {
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  dataDir = path.join(os.tmpdir(), `hangar-embedded-${process.pid}-${randomBytes(3).toString('hex')}`);
  await fs.mkdir(dataDir, { recursive: true, mode: 0o755 });
  up = await startUpstream();
});

afterAll(async () => {
  for (const s of servers) await kill(s, 'SIGKILL');
  // Whatever a failed test left running on the data dir goes with it.
  const pid = await postmaster().catch(() => 0);
  if (pid && alive(pid)) process.kill(pid, 'SIGQUIT');
  await up?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

describe('the embedded PostgreSQL', () => {
  it('is restarted when it is killed under a download, and the download finishes from its offset', async () => {
    const body = bytes(SIZE, 9);
    up.files.set('oom.gguf', { body, fault: { kind: 'drip', chunk: 32 * 1024, everyMs: 100 } });
    const server = await startServer({ ...env(), HANGAR_LOG_LEVEL: 'info' });
    servers.push(server);
    const token = await operatorToken(server.base);
    await fetchInto(server.base, token, 'oom', up.url('oom.gguf'), body);
    await midway(server.base, token, 'oom', SIZE);

    const first = await postmaster();
    process.kill(first, 'SIGKILL');
    // The rest at full speed: what is measured is where the transfer resumes, not how long the rest takes.
    up.files.set('oom.gguf', { body });
    const second = await until(
      'a new postmaster',
      async () => {
        const pid = await postmaster().catch(() => 0);
        return pid && pid !== first && alive(pid) ? pid : undefined;
      },
      20_000,
    );
    expect(second).not.toBe(first);

    const done = await settle(server.base, token, 'oom', 30_000);
    expect(done).toMatchObject({ state: 'PRESENT', error: null, bytesDone: SIZE });
    expect(done.files).toEqual([{ state: 'PRESENT', sha256: sha256(body), verified: true }]);
    expect(isRunning(server)).toBe(true);
    const log = server.output.join('');
    expect(log).toContain('the embedded PostgreSQL exited; restarting it on the same port');
    expect(log).toContain('restarted the embedded PostgreSQL');
    // The bytes from before the kill were kept: no request after the first started from zero. (Whether the
    // transfer paused at all depends on a progress write falling inside the outage, which lasts the supervisor's
    // first backoff, a second, plus PostgreSQL's recovery; the external-database test pins the resume down.)
    const requests = up.requests.filter((r) => r.name === 'oom.gguf');
    expect(requests[0]?.range).toBeUndefined();
    for (const r of requests.slice(1)) {
      expect(Number(r.range?.match(/^bytes=(\d+)-$/)?.[1])).toBeGreaterThan(0);
      expect(r.status).toBe(206);
    }
    await kill(server, 'SIGTERM');
    expect(await server.exited).toBe(0);
    expect(alive(second)).toBe(false);
  }, 60_000);

  it('starts again after the server was killed with SIGKILL, stopping the PostgreSQL it left behind', async () => {
    const server = await startServer(env());
    servers.push(server);
    const orphan = await postmaster();
    await kill(server, 'SIGKILL');
    // What kill -9 leaves: the server gone, its PostgreSQL still running on the data dir.
    expect(alive(orphan)).toBe(true);

    const again = await startServer(env());
    servers.push(again);
    expect(alive(orphan)).toBe(false);
    expect(await postmaster()).not.toBe(orphan);
    expect(again.output.join('')).toContain('stopping a PostgreSQL left running on this data dir by an earlier Hangar');
    const token = await operatorToken(again.base);
    expect(token).toMatch(/\S/);

    // A second Hangar started on a data dir that a live one is using is refused; the live one's PostgreSQL is
    // not a leftover, and is left alone.
    const live = await postmaster();
    const refused = await startServer({ ...env(), HANGAR_LOG_LEVEL: 'info' }).then(
      () => null,
      (err: Error) => err.message,
    );
    expect(refused).toContain(`another Hangar (process ${again.proc.pid}) is running on this data dir`);
    expect(alive(live)).toBe(true);
    expect((await readyz(again.base)).status).toBe(200);
    await kill(again, 'SIGTERM');
    expect(await again.exited).toBe(0);
  }, 60_000);

  it('stops on Ctrl-C (SIGINT to the whole process group) after draining: no error, no restart, no lease held', async () => {
    const body = bytes(SIZE, 11);
    up.files.set('ctrl-c.gguf', { body, fault: { kind: 'drip', chunk: 32 * 1024, everyMs: 100 } });
    // In a process group of its own, as a terminal's foreground job (`pnpm start`) is.
    const server = await startServer({ ...env(), HANGAR_LOG_LEVEL: 'info' }, 60_000, { detached: true });
    servers.push(server);
    const token = await operatorToken(server.base);
    await fetchInto(server.base, token, 'ctrl-c', up.url('ctrl-c.gguf'), body);
    await midway(server.base, token, 'ctrl-c', SIZE);
    const database = await postmaster();

    // What the terminal does on Ctrl-C: SIGINT to every process in the foreground group.
    process.kill(-(server.proc.pid as number), 'SIGINT');
    expect(await server.exited).toBe(0);
    const lines = server.output
      .join('')
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: string; msg: string });
    expect(lines.filter((l) => l.level === 'error')).toEqual([]);
    const said = lines.map((l) => l.msg);
    expect(said).not.toContain('the embedded PostgreSQL exited; restarting it on the same port');
    expect(said).not.toContain('could not put a download back in the queue; it resumes when its lease runs out');
    // Stopped by Hangar, once the server had drained.
    expect(said).toContain('stopping');
    expect(said.indexOf('stopped the embedded PostgreSQL')).toBeGreaterThan(said.indexOf('stopping'));
    expect(alive(database)).toBe(false);

    // The database as the server left it: the download is back in the queue, held by no one.
    const db = await startEmbeddedPostgres(path.join(dataDir, 'pg'), createLogger('silent'));
    const client = new pg.Client({ connectionString: db.url('hangar') });
    try {
      await client.connect();
      const rows = await client.query(`SELECT state, "leaseOwner" FROM "MirrorFile" WHERE model = 'ctrl-c'`);
      expect(rows.rows).toEqual([{ state: 'QUEUED', leaseOwner: null }]);
    } finally {
      await client.end().catch(() => {});
      await db.stop();
    }
  }, 90_000);

  it('refuses to start, saying why at the default log level, when the lock file names a process that is not its PostgreSQL', async () => {
    // A lock file left from before a reboot whose PID now belongs to something else (here: this test runner).
    await fs.writeFile(lockFile(), `${process.pid}\n${path.join(dataDir, 'pg')}\n0\n5432\n\n127.0.0.1\n`);
    // info is the default level.
    const failed = await startServer({ ...env(), HANGAR_LOG_LEVEL: 'info' }).then(
      () => null,
      (err: Error) => err.message,
    );
    expect(failed).toContain('Hangar failed to start:');
    expect(failed).toContain(`names process ${process.pid}, which is running but is not the PostgreSQL of`);
    expect(failed).toContain('remove');
    expect(alive(process.pid)).toBe(true);
    await fs.rm(lockFile());
  }, 30_000);
});
