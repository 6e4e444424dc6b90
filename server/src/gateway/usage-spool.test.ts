import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DbRelay, relayedDatabase } from '../../test/fixtures/db-relay.js';
import { type UsageEvent, UsageRecorder } from './usage.js';

// The spool's replay, step by step: a recorder leaves a file holding a write the database took (its line still
// there), a second's rows the database never got (PostgreSQL away, through a relay the test cuts, until after it
// stopped), and a last line cut short as a crash cuts it. A recorder started later on the same data dir adds
// exactly what the database did not have, once. (test/usage-crash.test.ts kills the real server with kill -9.)

let relay: DbRelay;
let dir: string;
const log = createLogger('silent');
/** Never ticks: the test says when each recorder writes. */
const NO_TICK = 1_000_000_000;

beforeAll(async () => {
  relay = await relayedDatabase();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-usage-spool-'));
});

afterAll(async () => {
  await relay?.database.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

const event = (tokens: number, model = 'spooled'): UsageEvent => ({
  at: new Date(),
  tokenId: 'spool-token',
  userId: 'spool-user',
  model,
  adapter: '',
  node: 'n',
  replicaId: 'r',
  outcome: 'ok',
  promptTokens: tokens,
  completionTokens: 1,
  ttftMs: 5,
  durationMs: 10,
});

const accounted = async (model = 'spooled') => {
  const sums = await relay.database.prisma.usageMinute.aggregate({
    where: { model },
    _sum: { requests: true, promptTokens: true },
  });
  return { requests: sums._sum.requests ?? 0, promptTokens: Number(sums._sum.promptTokens ?? 0n) };
};

describe('the usage spool', () => {
  it('adds what a dead process left on disk, once, whatever it had written before it died', async () => {
    const spoolDir = path.join(dir, 'usage');
    const dead = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await dead.start(NO_TICK);
    // Written: in the database and still in the file.
    for (const n of [1, 2, 3]) dead.record(event(n));
    await dead.flush();
    expect(await accounted()).toEqual({ requests: 3, promptTokens: 6 });
    // On disk only: the database is away when it is written.
    await relay.cut();
    for (const n of [10, 20]) dead.record(event(n));
    // It stops (or dies: the file is the same) before the database comes back.
    await dead.stop();
    const [file] = await fs.readdir(spoolDir);
    expect(file).toMatch(/\.ndjson$/);
    // And the line the crash cut short (never written whole, so never acknowledged to anybody).
    await fs.appendFile(path.join(spoolDir, file as string), '{"seq":3,"rows":[{"minute":"2026-');
    await relay.mend();

    const next = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await next.start(NO_TICK);
    await next.flush();
    expect(await accounted()).toEqual({ requests: 5, promptTokens: 36 });
    // The dead process's file and its record are gone; another start adds nothing more.
    expect(await fs.readdir(spoolDir)).not.toContain(file);
    await next.stop();
    expect(await fs.readdir(spoolDir)).toEqual([]);
    expect(await relay.database.prisma.$queryRaw`SELECT generation FROM "UsageSpool"`).toEqual([]);
    const again = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await again.start(NO_TICK);
    await again.stop();
    expect(await accounted()).toEqual({ requests: 5, promptTokens: 36 });
  });

  it('leaves alone the file of a server still running on the same data dir', async () => {
    const spoolDir = path.join(dir, 'shared');
    const running = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await running.start(NO_TICK);
    running.record(event(1, 'shared'));
    await running.flush();
    const [file] = await fs.readdir(spoolDir);
    const starting = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await starting.start(NO_TICK);
    await starting.flush();
    expect(await fs.readdir(spoolDir)).toContain(file);
    running.record(event(2, 'shared'));
    await running.stop();
    await starting.stop();
    expect(await accounted('shared')).toEqual({ requests: 2, promptTokens: 3 });
    expect(await fs.readdir(spoolDir)).toEqual([]);
  });

  it('carries cached tokens through the spool, and still adds a line spooled before rows counted them', async () => {
    const spoolDir = path.join(dir, 'cached');
    const dead = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await dead.start(NO_TICK);
    await relay.cut();
    dead.record({ ...event(10, 'cached'), cachedTokens: 7 });
    await dead.stop();
    const [file] = await fs.readdir(spoolDir);
    const where = path.join(spoolDir, file as string);
    const line = JSON.parse((await fs.readFile(where, 'utf8')).trim().split('\n').at(-1) as string) as {
      seq: number;
      rows: Record<string, unknown>[];
    };
    expect(line.rows[0]?.cachedTokens).toBe(7);
    // The same second as the previous version wrote it: no cachedTokens in its rows.
    const old = { seq: line.seq + 1, rows: line.rows.map(({ cachedTokens: _c, ...r }) => r) };
    await fs.appendFile(where, `${JSON.stringify(old)}\n`);
    await relay.mend();

    const next = new UsageRecorder({ db: relay.database.prisma, log, spoolDir });
    await next.start(NO_TICK);
    await next.flush();
    await next.stop();
    const sums = await relay.database.prisma.usageMinute.aggregate({
      where: { model: 'cached' },
      _sum: { requests: true, promptTokens: true, cachedTokens: true },
    });
    expect({
      requests: sums._sum.requests,
      promptTokens: Number(sums._sum.promptTokens),
      cachedTokens: Number(sums._sum.cachedTokens),
    }).toEqual({ requests: 2, promptTokens: 20, cachedTokens: 7 });
  });
});
