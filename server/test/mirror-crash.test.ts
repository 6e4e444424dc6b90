import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import {
  fetchInto,
  kill,
  operatorToken,
  type ServerProcess,
  settle,
  startServer as startProcess,
  type VersionView,
  versionOf,
} from './fixtures/server-process.js';
import { freshDatabase } from './harness.js';

// A power cut, as far as a process can have one: the real server, spawned as `node --import tsx src/main.ts`,
// killed with SIGKILL in the middle of a download, so no shutdown code runs. Started again on the same database
// and data dir, it must finish the file from the partial (a Range request, not the whole file again), verify it,
// and leave no partial and no row stuck in FETCHING.
//
// With DATABASE_URL, the dead process's lease (30 s from its last renewal) has to run out before the new one
// takes the file over: another replica may still be working on it, and nothing here tells a dead process
// from a slow one. So this test waits that long, on purpose.

const SIZE = 2 * 1024 * 1024;
const CHUNK = 64 * 1024;
const LEASE_MS = 30_000;

let database: Database;
let dataDir: string;
let up: Upstream;
const children: ServerProcess[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-crash-'));
  up = await startUpstream();
});

afterAll(async () => {
  // Runs on failure too: a server left running would hold the port, the database and the upstream open.
  for (const c of children) {
    if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
    await c.exited;
  }
  await up?.close();
  await database?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

/** The real server on this test's database and data dir, as its own process (see fixtures/server-process.ts). */
async function startServer(): Promise<ServerProcess> {
  const server = await startProcess({
    DATABASE_URL: database.url,
    HANGAR_DATA_DIR: dataDir,
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
  });
  children.push(server);
  return server;
}

describe('leases across processes', () => {
  it('finishes a file from its partial after the server is killed with SIGKILL, verified, with nothing left behind', async () => {
    const body = bytes(SIZE, 42);
    const digest = sha256(body);
    // 64 KiB every 100 ms: about 3 s for the file, so the kill lands in the middle.
    up.files.set('crash.gguf', { body, fault: { kind: 'drip', chunk: CHUNK, everyMs: 100 } });

    const first = await startServer();
    const token = await operatorToken(first.base);
    await fetchInto(first.base, token, 'crash', up.url('crash.gguf'), body);

    // Progress is written about once a second; wait for a write that is neither the start nor the end.
    let seen: VersionView | null = null;
    const end = Date.now() + 20_000;
    while (!(seen && seen.bytesDone > 0 && seen.bytesDone < SIZE)) {
      if (Date.now() > end) throw new Error(`no progress seen: ${JSON.stringify(seen)}`);
      await new Promise((r) => setTimeout(r, 50));
      seen = await versionOf(first.base, token, 'crash');
    }
    expect(seen.state).toBe('FETCHING');
    first.proc.kill('SIGKILL');
    await first.exited;
    expect(first.proc.signalCode).toBe('SIGKILL');
    const killedAt = Date.now();

    // What the dead process left: a row that still says FETCHING under its lease, and a partial on disk.
    const orphan = await database.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'crash' } });
    expect(orphan.state).toBe('FETCHING');
    expect(orphan.leaseOwner).not.toBeNull();
    const partial = path.join(dataDir, 'mirror', 'partial', `${orphan.id}.part`);
    const partialSize = (await fs.stat(partial)).size;
    expect(partialSize).toBeGreaterThanOrEqual(seen.bytesDone);
    expect(partialSize).toBeLessThan(SIZE);
    const requestsBefore = up.requests.length;

    const second = await startServer();
    const done = await settle(second.base, token, 'crash', LEASE_MS + 30_000);
    const tookOverAfterMs = Date.now() - killedAt;

    expect(done).toMatchObject({ state: 'PRESENT', verified: true, error: null, bytesDone: SIZE, bytesTotal: SIZE });
    expect(done.files).toEqual([{ state: 'PRESENT', sha256: digest, verified: true }]);
    const onDisk = path.join(dataDir, 'mirror', 'files', 'crash', 'v1', 'crash.gguf');
    expect(sha256(await fs.readFile(onDisk))).toBe(digest);

    // Resumed from the partial: the new process asked for the rest, from at least where the dead one had got to.
    const after = up.requests.slice(requestsBefore).filter((r) => r.name === 'crash.gguf');
    expect(after, JSON.stringify(up.requests)).toHaveLength(1);
    const from = Number(after[0]?.range?.match(/^bytes=(\d+)-$/)?.[1]);
    expect(from).toBeGreaterThan(0);
    expect(from).toBe(partialSize);
    expect(after[0]?.status).toBe(206);

    expect(existsSync(partial)).toBe(false);
    expect(await fs.readdir(path.join(dataDir, 'mirror', 'partial'))).toEqual([]);
    const rows = await database.prisma.mirrorFile.findMany();
    expect(rows.filter((r) => r.state === 'FETCHING' || r.state === 'VERIFYING')).toEqual([]);
    expect(rows[0]).toMatchObject({ state: 'PRESENT', actualSha256: digest, leaseOwner: null });

    // And it serves what it verified.
    const served = await fetch(`${second.base}/mirror/crash/v1/crash.gguf`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(served.headers.get('etag')).toBe(`"${digest}"`);
    expect(sha256(Buffer.from(await served.arrayBuffer()))).toBe(digest);

    console.info(
      `crash test: killed at ${seen.bytesDone} persisted / ${partialSize} on disk of ${SIZE}; resumed with Range bytes=${from}-, ${(tookOverAfterMs / 1000).toFixed(1)} s after the kill`,
    );
    await kill(second, 'SIGTERM');
  }, 120_000);

  // The other side of the lease: a process that is alive keeps its file, even when the lease has lapsed (an
  // upstream silent for longer than the lease, a long backoff, the database out of reach for a while). Its own
  // next poll taking the file again would start a second transfer into the same partial, and the slower of the
  // two would put its bytes in place over the verified file.
  it('does not take a file over from itself when its lease lapses mid-transfer', async () => {
    const body = bytes(SIZE, 43);
    up.files.set('lapse.gguf', { body, fault: { kind: 'drip', chunk: CHUNK / 2, everyMs: 100 } });
    const server = await startServer();
    const token = await operatorToken(server.base);
    await fetchInto(server.base, token, 'lapse', up.url('lapse.gguf'), body);
    let seen: VersionView | null = null;
    while (!(seen && seen.bytesDone > 0)) {
      await new Promise((r) => setTimeout(r, 50));
      seen = await versionOf(server.base, token, 'lapse');
    }
    await database.prisma.mirrorFile.updateMany({
      where: { model: 'lapse' },
      data: { leaseUntil: new Date(Date.now() - 1000) },
    });
    await new Promise((r) => setTimeout(r, 2500)); // longer than the workers' poll

    const done = await settle(server.base, token, 'lapse', 30_000);
    expect(done).toMatchObject({ state: 'PRESENT', verified: true, bytesDone: SIZE });
    expect(up.requests.filter((r) => r.name === 'lapse.gguf')).toHaveLength(1);
    expect(await database.prisma.mirrorFile.findFirst({ where: { model: 'lapse' } })).toMatchObject({ attempts: 1 });
    const onDisk = path.join(dataDir, 'mirror', 'files', 'lapse', 'v1', 'lapse.gguf');
    expect(sha256(await fs.readFile(onDisk))).toBe(sha256(body));
    await kill(server, 'SIGTERM');
  }, 60_000);
});
