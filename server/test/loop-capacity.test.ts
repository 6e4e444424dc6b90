import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditService } from '../src/audit/audit.service.js';
import { recordLastRequest } from '../src/catalog/last-request.js';
import { POOL_SIZES } from '../src/db/client.js';
import type { Database } from '../src/db/database.js';
import { FleetService } from '../src/fleet/fleet.service.js';
import { RouteTable } from '../src/gateway/routes.js';
import { UsageRecorder } from '../src/gateway/usage.js';
import { TrainLedger } from '../src/train/train-ledger.js';
import { freshDatabase } from './harness.js';

// Under 50 connections of the Mirror page's query the single pool of 20 ran dry, and the placement pass failed
// with "Unable to start a transaction in the given time": request load starved the control loops. Here every
// request connection is held, as such a burst holds them, and the loops' work still goes through.

let db: Database;
let release: () => void = () => {};
let held: Promise<unknown>[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  const gate = new Promise<void>((r) => {
    release = r;
  });
  let open = 0;
  held = Array.from({ length: POOL_SIZES.requests }, () =>
    db.prisma.$transaction(
      async (tx) => {
        await tx.$executeRaw`SELECT 1`;
        open++;
        await gate;
      },
      { maxWait: 10_000, timeout: 60_000 },
    ),
  );
  for (let i = 0; i < 500 && open < POOL_SIZES.requests; i++) await new Promise((r) => setTimeout(r, 10));
  expect(open).toBe(POOL_SIZES.requests);
});
afterAll(async () => {
  release();
  await Promise.allSettled(held);
  await db?.close();
});

describe('the loops keep their own database capacity', () => {
  it('a request finds no connection while the requests hold them all', async () => {
    await expect(db.prisma.$transaction(async (tx) => tx.$executeRaw`SELECT 1`, { maxWait: 300 })).rejects.toThrow(
      /Unable to start a transaction in the given time/,
    );
  });

  it("the loops' client still has connections, and it is the same client from either side", async () => {
    const n = await db.prisma.loops.$transaction(async (tx) => tx.$executeRaw`SELECT 1`, { maxWait: 2000 });
    expect(n).toBe(1);
    expect(db.prisma.loops.loops).toBe(db.prisma.loops);
    expect(db.prisma.loops).not.toBe(db.prisma);
  });

  it('the placement pass, the usage recorder and the route table read and write, though a request asked for them', async () => {
    const lines: { level: string; msg: string }[] = [];
    const log = createLogger('info', (l) => lines.push(JSON.parse(l)));
    const audit = new AuditService(db.prisma, log);
    const fleet = new FleetService({ db: db.prisma, audit, log, train: new TrainLedger({ db: db.prisma, audit }) });
    // Called here as a request calls it (catalog changes, the gateway waking a model).
    await fleet.place();
    expect(lines.filter((l) => l.level === 'error' || l.level === 'warn')).toEqual([]);
    expect(fleet.health.paused).toBeNull();

    const usage = new UsageRecorder({
      db: db.prisma,
      log,
      // The catalog's write of each model's last request, without a whole catalog.
      catalog: { recordLastRequest: (rows, tx = db.prisma.loops) => recordLastRequest(tx, rows) },
    });
    usage.touch('no-such-model');
    await usage.flush();
    expect(lines.filter((l) => l.level === 'error' || l.level === 'warn')).toEqual([]);

    // The gateway's route table learns of new models and replicas however busy the API is.
    await db.prisma.loops.catalogModel.create({
      data: { name: 'busy-day', source: 'mirror:busy/v1', engine: 'llamacpp' },
    });
    const routes = new RouteTable({ db: db.prisma, log });
    await routes.refresh();
    expect(lines.filter((l) => l.level === 'error' || l.level === 'warn')).toEqual([]);
    expect(routes.lookup('busy-day')?.model.name).toBe('busy-day');
  });
});
