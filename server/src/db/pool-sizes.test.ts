import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../../test/harness.js';
import { type App, createApp } from '../app.js';
import { loadConfig } from '../config.js';
import { CONNECTION_NAMES, connectionBudget } from './connections.js';
import type { Database } from './database.js';

// HANGAR_DB_POOL_SIZE and HANGAR_DB_LOOPS_POOL_SIZE are what an operator sizes max_connections by: three replicas
// at the defaults hold up to 105, past a stock PostgreSQL's 100. Checked where it counts, in PostgreSQL's own
// pg_stat_activity: a server built from the settings (DATABASE_URL, as an operator runs it) is given more
// concurrent work than either pool holds, and the connections of each pool are counted while it works.

let fresh: Database;
let dataDir: string;
let app: App;
let observer: pg.Client;

beforeAll(async () => {
  // A migrated database of this file's own; the server opens its own pools on it from the settings.
  fresh = await freshDatabase();
  await fresh.prisma.$disconnect();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-pools-'));
  const config = loadConfig({
    DATABASE_URL: fresh.url,
    HANGAR_DATA_DIR: dataDir,
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
    HANGAR_LOG_LEVEL: 'silent',
    HANGAR_DB_POOL_SIZE: '3',
    HANGAR_DB_LOOPS_POOL_SIZE: '2',
  });
  app = await createApp({ config, log: createLogger('silent'), print: () => {} });
  observer = new pg.Client({ connectionString: fresh.url, application_name: 'pool-sizes test' });
  await observer.connect();
});
afterAll(async () => {
  await app?.stop();
  await observer?.end();
  await fresh?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

/**
 * The server's connections to this database now, by pool. A connection still starting up is left out: it shows in
 * pg_stat_activity with its database before its application_name is applied (its state is 'starting' until it is ready).
 */
async function connections(): Promise<Record<string, number>> {
  const { rows } = await observer.query<{ name: string; n: number }>(
    `SELECT application_name AS name, count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND state IS NOT NULL AND state <> 'starting'
      GROUP BY application_name`,
  );
  return Object.fromEntries(rows.map((r) => [r.name, r.n]));
}

describe('the database pools', () => {
  it('hold no more connections than HANGAR_DB_POOL_SIZE and HANGAR_DB_LOOPS_POOL_SIZE, whatever the work', async () => {
    const db = app.db.prisma;
    const most: Record<string, number> = {};
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        for (const [name, n] of Object.entries(await connections())) most[name] = Math.max(most[name] ?? 0, n);
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    // Eight transactions at once on each pool, each holding its connection a while: more than either pool may
    // open (a transaction keeps its connection to itself; the pools hand the rest theirs as they come back).
    const hold = (client: typeof db) =>
      client.$transaction(async (tx) => tx.$executeRaw`SELECT pg_sleep(0.3)`, { maxWait: 30_000, timeout: 30_000 });
    const work = [...Array.from({ length: 8 }, () => hold(db)), ...Array.from({ length: 8 }, () => hold(db.loops))];
    try {
      // Until both pools are seen full, so the sampler has not merely looked too early.
      await expect
        .poll(() => [most[CONNECTION_NAMES.requests], most[CONNECTION_NAMES.loops]], { timeout: 20_000 })
        .toEqual([3, 2]);
      await Promise.all(work);
    } finally {
      sampling = false;
      await sampler;
      await Promise.allSettled(work);
    }
    expect(most[CONNECTION_NAMES.requests]).toBe(3);
    expect(most[CONNECTION_NAMES.loops]).toBe(2);
    // The one LISTEN connection for live events, named too.
    expect(most[CONNECTION_NAMES.events]).toBe(1);
    // Every connection of the server is one of its named pools, and all of them fit the budget the docs give.
    const named = new Set<string>(Object.values(CONNECTION_NAMES));
    expect(Object.keys(most).filter((n) => !named.has(n))).toEqual([]);
    const total = Object.values(await connections()).reduce((a, b) => a + b, 0);
    expect(total).toBeLessThanOrEqual(connectionBudget({ requests: 3, loops: 2 }));
  });

  it('refuses a pool size that is not a whole number of at least 2, naming the variable', () => {
    expect(() => loadConfig({ HANGAR_DB_POOL_SIZE: '1' })).toThrow(
      /HANGAR_DB_POOL_SIZE="1" is not accepted: at least 2/,
    );
    expect(() => loadConfig({ HANGAR_DB_LOOPS_POOL_SIZE: 'many' })).toThrow(
      /HANGAR_DB_LOOPS_POOL_SIZE="many" is not accepted: a number of connections/,
    );
    expect(loadConfig({}).dbPoolSizes).toEqual({ requests: 20, loops: 10 });
  });
});
