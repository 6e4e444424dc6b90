import { AsyncLocalStorage } from 'node:async_hooks';
import { PrismaPg } from '@prisma/adapter-pg';
import { PrismaClient } from '../generated/prisma/client.js';

export type Db = PrismaClient;
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

const loopWork = new AsyncLocalStorage<true>();

/**
 * Runs `work`, and everything it starts (timers, awaited calls, transactions), on the loops' connections.
 * Each loop's entry point (a pass, a tick, a sweep, a flush) goes through here, also when a request kicks it:
 * the work is the loop's, and it must not wait behind the request that asked for it.
 */
export function asLoop<T>(work: () => T): T {
  return loopWork.run(true, work);
}

/** Whether the code calling runs as a background loop's (asLoop), for tests and logs. */
export function inLoop(): boolean {
  return loopWork.getStore() === true;
}

/**
 * One client to the services, two pools behind it: each call goes to the loops' client inside asLoop and to the
 * requests' client otherwise, chosen when the call is made. A transaction stays on the client that began it
 * (its `tx` is that client's). `$disconnect` ends both.
 */
export function createPrisma(databaseUrl: string, sizes = POOL_SIZES): Db {
  const requests = new PrismaClient({ adapter: new PrismaPg({ connectionString: databaseUrl, max: sizes.requests }) });
  const loops = new PrismaClient({ adapter: new PrismaPg({ connectionString: databaseUrl, max: sizes.loops }) });
  const disconnect = async () => {
    await Promise.all([requests.$disconnect(), loops.$disconnect()]);
  };
  return new Proxy(requests, {
    get(_target, prop) {
      if (prop === '$disconnect') return disconnect;
      const client = loopWork.getStore() ? loops : requests;
      const value = Reflect.get(client, prop, client);
      return typeof value === 'function' ? value.bind(client) : value;
    },
  });
}
