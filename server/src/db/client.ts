import { PrismaPg } from '@prisma/adapter-pg';
import { PrismaClient } from '../generated/prisma/client.js';
import { DatabaseClock } from './clock.js';
import { connectionOptions } from './connections.js';

/**
 * The requests' client, with the loops' beside it as `loops` (see createPrisma). The loops' client has itself as
 * `loops`, so code handed either writes `db.loops` for a loop's work and is right both ways.
 */
export interface Db extends PrismaClient {
  readonly loops: Db;
  /** The database's now(), read in memory: what leases and liveness are judged on (db/clock.ts). */
  readonly clock: DatabaseClock;
}
/** A transaction client, as `db.$transaction(async (tx) => …)` hands it over. */
export type Tx = Parameters<Parameters<PrismaClient['$transaction']>[0]>[0];

/**
 * Connections for requests, and a few kept for the background loops. 50 heavy GraphQL requests once held every
 * connection of a single pool long enough for the placement pass to fail with "Unable to start a transaction in
 * the given time": a replica that died was not replaced while the console was busy. The loops do small, short
 * work; requests can take all of theirs and still not reach these. Ten, not five: a connection cut in the middle
 * of a transaction is not always handed back to its pool (seen in serve-job-outage.test.ts), and five loops at
 * work when the database went away could leave a pool of five with none.
 */
export const POOL_SIZES = { requests: 20, loops: 10 };
// HANGAR_DB_POOL_SIZE and HANGAR_DB_LOOPS_POOL_SIZE set them (config.ts); these are their defaults.

/**
 * Two clients on two pools: `db` for requests, `db.loops` for the background loops. Each loop's work (a pass, a
 * tick, a sweep, a flush, a transfer's progress) names `db.loops` for its reads and writes, also when a request
 * kicks it: the work is the loop's, and it must not wait behind the request that asked for it. Named where it is
 * done, not carried along: an AsyncLocalStorage did that before, and its promise hooks put an async id and a
 * store on every promise of the process: 18 MiB of the 71 that 1000 WebSocket subscribers added to the RSS, and a
 * quarter of an event's delay at 1000 of them (bench/subscriptions.ts). `$disconnect` ends both.
 */
export function createPrisma(databaseUrl: string, sizes = POOL_SIZES): Db {
  const pool = (name: 'requests' | 'loops') =>
    new PrismaPg({ connectionString: databaseUrl, max: sizes[name], ...connectionOptions(name) });
  const requests = new PrismaClient({ adapter: pool('requests') });
  const loops = new PrismaClient({ adapter: pool('loops') });
  const clock = new DatabaseClock(loops);
  const loopsDb = Object.defineProperties(loops, { loops: { get: () => loopsDb }, clock: { value: clock } }) as Db;
  const disconnectLoops = loops.$disconnect.bind(loops);
  const disconnectRequests = requests.$disconnect.bind(requests);
  const both = async () => {
    await Promise.all([disconnectRequests(), disconnectLoops()]);
  };
  Object.defineProperty(loops, '$disconnect', { value: both });
  return Object.defineProperties(requests, {
    loops: { get: () => loopsDb },
    clock: { value: clock },
    $disconnect: { value: both },
  }) as Db;
}
