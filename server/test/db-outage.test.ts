import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDatabaseIfMissing } from '../src/db/embedded.js';
import { type Cluster, makeCluster, startCluster } from './fixtures/pg-cluster.js';
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

// PostgreSQL going away under a running download, the way a database restart, a failover or a crash does it:
// an external cluster of this test's own (DATABASE_URL; not the run's shared one, which other files use), stopped
// with `pg_ctl stop -m immediate` (no shutdown checkpoint, every connection cut) while a slow upstream is
// sending a file, then started again on the same port. The server must stay up, say it is not ready while the
// database is away, and finish the file from the bytes it already had.

const SIZE = 2 * 1024 * 1024;

let root: string;
let cluster: Cluster;
let up: Upstream;
const servers: ServerProcess[] = [];

beforeAll(async () => {
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  root = path.join(os.tmpdir(), `hangar-outage-${process.pid}-${randomBytes(3).toString('hex')}`);
  await fs.mkdir(path.join(root, 'data'), { recursive: true, mode: 0o755 });
  cluster = await makeCluster(root);
  await startCluster(cluster);
  await createDatabaseIfMissing(cluster.url('postgres'), 'hangar');
  up = await startUpstream();
}, 60_000);

afterAll(async () => {
  for (const s of servers) await kill(s, 'SIGKILL');
  await up?.close();
  await cluster?.pgCtl('stop', '-m', 'immediate').catch(() => {});
  if (root) await fs.rm(root, { recursive: true, force: true });
});

describe('an external PostgreSQL stopped under a download', () => {
  it('keeps the process up, answers unready, and finishes the file from its offset once PostgreSQL is back', async () => {
    const body = bytes(SIZE, 7);
    // 32 KiB every 100 ms: about 6.5 s for the file, so the outage lands in the middle.
    up.files.set('outage.gguf', { body, fault: { kind: 'drip', chunk: 32 * 1024, everyMs: 100 } });
    const dataDir = path.join(root, 'data');
    const server = await startServer({
      DATABASE_URL: cluster.url('hangar'),
      HANGAR_DATA_DIR: dataDir,
      HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
      HANGAR_LOG_LEVEL: 'info',
    });
    servers.push(server);
    const token = await operatorToken(server.base);
    await fetchInto(server.base, token, 'outage', up.url('outage.gguf'), body);
    await midway(server.base, token, 'outage', SIZE);

    await cluster.pgCtl('stop', '-m', 'immediate', '-w');
    const unready = await until(
      '/readyz to say the database is unreachable',
      async () => {
        const r = await readyz(server.base);
        return r.status === 503 ? r : undefined;
      },
      10_000,
    );
    expect(unready.body.ready).toBe(false);
    expect(unready.body.reason).toContain('database unreachable');
    // Until every background loop has met the outage (placement ticks every 5 s), and /readyz names them.
    const paused = await until(
      '/readyz to name every paused loop',
      async () => {
        const r = await readyz(server.base);
        const reason = r.body.reason ?? '';
        return ['mirror downloads', 'serve jobs', 'training sweeps', 'placement'].every((l) => reason.includes(l))
          ? r
          : undefined;
      },
      15_000,
    );
    expect(paused.status).toBe(503);
    expect(paused.body.reason).toContain('waiting for the database: ');
    expect(paused.body.reason).toContain('live events: not connected to the database');
    // And a few more ticks of each, with no database: nothing ends the process.
    await new Promise((r) => setTimeout(r, 1500));
    expect(isRunning(server), server.output.join('')).toBe(true);
    const partials = await fs.readdir(path.join(dataDir, 'mirror', 'partial'));
    expect(partials).toHaveLength(1);
    const keptBytes = (await fs.stat(path.join(dataDir, 'mirror', 'partial', partials[0] as string))).size;
    expect(keptBytes).toBeGreaterThan(0);
    expect(keptBytes).toBeLessThan(SIZE);
    const requestsBefore = up.requests.filter((r) => r.name === 'outage.gguf').length;

    // The rest at full speed: what is measured is where the transfer resumes, not how long the rest takes.
    up.files.set('outage.gguf', { body });
    await startCluster(cluster);
    const done = await settle(server.base, token, 'outage', 30_000);
    expect(done).toMatchObject({ state: 'PRESENT', error: null, bytesDone: SIZE, bytesTotal: SIZE });
    expect(done.files).toEqual([{ state: 'PRESENT', sha256: sha256(body), verified: true }]);
    const onDisk = await fs.readFile(path.join(dataDir, 'mirror', 'files', 'outage', 'v1', 'outage.gguf'));
    expect(sha256(onDisk)).toBe(sha256(body));

    // Resumed, not restarted: every request after the outage asked for a range from where the partial ended.
    const after = up.requests.filter((r) => r.name === 'outage.gguf').slice(requestsBefore);
    expect(after.length, JSON.stringify(up.requests)).toBeGreaterThanOrEqual(1);
    const from = Number(after[0]?.range?.match(/^bytes=(\d+)-$/)?.[1]);
    expect(from).toBe(keptBytes);
    expect(after.every((r) => r.status === 206 && Number(r.range?.match(/^bytes=(\d+)-$/)?.[1]) > 0)).toBe(true);

    await until(
      '/readyz to answer 200 again',
      async () => ((await readyz(server.base)).status === 200 ? true : undefined),
      15_000,
    );
    expect(isRunning(server)).toBe(true);
    // Every loop paused and came back, each saying so once, not once per tick: the outage spanned several
    // ticks of each.
    const log = server.output.join('');
    for (const loop of ['mirror downloads', 'serve jobs', 'training sweeps', 'placement']) {
      expect(log.split(`${loop}: the database is unreachable; paused`).length - 1, loop).toBe(1);
      expect(log, loop).toContain(`${loop}: the database is back; resumed`);
    }
    expect(log.split('live events: no connection to the database').length - 1).toBe(1);
    expect(log).toContain('live events: listening again');
    expect(log).not.toContain('unhandled promise rejection');
    console.info(
      `outage test: ${keptBytes} of ${SIZE} bytes on disk when PostgreSQL stopped; resumed with Range bytes=${from}-`,
    );
    await kill(server, 'SIGTERM');
    expect(await server.exited).toBe(0);
  }, 60_000);
});
