import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { freshDatabase } from '../../test/harness.js';
import { Prisma } from '../generated/prisma/client.js';
import { createPrisma, type Db } from './client.js';
import type { Database } from './database.js';
import { LeaseQueue } from './lease.js';

// The lease is what keeps two server replicas off one file or one serve job, so it is tested where replicas
// meet: one PostgreSQL, two clients with connections of their own, claiming at the same moment. A table of its
// own keeps the rules apart from any one kind of work.

let database: Database;
let other: Db;
const queue = new LeaseQueue({ table: 'LeaseProbe', leaseMs: 30_000, touchColumn: 'updatedAt' });
const waiting = {
  claimable: Prisma.sql`state = 'QUEUED' OR (state = 'RUNNING' AND ${queue.expired()})`,
  order: Prisma.sql`"createdAt", id`,
  set: Prisma.sql`state = 'RUNNING'`,
};

beforeAll(async () => {
  database = await freshDatabase();
  other = createPrisma(database.url);
  await database.prisma.$executeRaw`
    CREATE TABLE "LeaseProbe" (
      id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
      state text NOT NULL DEFAULT 'QUEUED',
      "leaseOwner" text,
      "leaseUntil" timestamp(3),
      "createdAt" timestamp(3) NOT NULL DEFAULT clock_timestamp(),
      "updatedAt" timestamp(3)
    )`;
});
afterAll(async () => {
  await other?.$disconnect();
  await database?.close();
});
beforeEach(async () => {
  await database.prisma.$executeRaw`DELETE FROM "LeaseProbe"`;
});

const addRows = (n: number) =>
  database.prisma.$executeRaw`INSERT INTO "LeaseProbe" (state) SELECT 'QUEUED' FROM generate_series(1, ${n}::int)`;

const row = async (id: string) =>
  (
    await database.prisma.$queryRaw<{ leaseOwner: string | null; leaseUntil: Date | null; state: string }[]>`
      SELECT "leaseOwner", "leaseUntil", state FROM "LeaseProbe" WHERE id = ${id}::uuid`
  )[0];

describe('LeaseQueue', () => {
  it('never gives one row to two claimers, however many claim at once', async () => {
    await addRows(40);
    // Two replicas, each with several claims in flight: 48 claims for 40 rows, on two connection pools.
    const claimsOf = (db: Db, holder: string) =>
      Promise.all(Array.from({ length: 24 }, () => queue.claim(db, holder, waiting)));
    const [first, second] = await Promise.all([claimsOf(database.prisma, 'a'), claimsOf(other, 'b')]);
    const ids = [...first, ...second].flatMap((claimed) => (claimed ? [claimed.id] : []));
    expect(ids).toHaveLength(40);
    expect(new Set(ids).size).toBe(40);
    // Each row says who holds it, and it is the claimer that got it.
    for (const claimed of first) if (claimed) expect((await row(claimed.id))?.leaseOwner).toBe('a');
    for (const claimed of second) if (claimed) expect((await row(claimed.id))?.leaseOwner).toBe('b');
    expect(await queue.claim(other, 'b', waiting)).toBeNull();
  });

  it('lets another claimer take a row whose lease ran out, and then the first holder has lost it', async () => {
    await addRows(1);
    const claimed = await queue.claim(database.prisma, 'a', waiting);
    expect(claimed).not.toBeNull();
    const id = claimed?.id ?? '';
    // Held and in time: nobody else gets it.
    expect(await queue.claim(other, 'b', waiting)).toBeNull();
    // Its holder stopped renewing (a replica that died): the deadline passes.
    await database.prisma.$executeRaw`UPDATE "LeaseProbe" SET "leaseUntil" = now() - interval '1 second'`;
    expect((await queue.claim(other, 'b', waiting))?.id).toBe(id);
    expect((await row(id))?.leaseOwner).toBe('b');
    // The old holder comes back: it can neither renew nor release what is now b's.
    expect(await queue.renew(database.prisma, id, 'a')).toBe(false);
    expect(await queue.release(database.prisma, id, 'a')).toBe(false);
    expect((await row(id))?.leaseOwner).toBe('b');
  });

  it('is released only by its holder, and a released row can be claimed again', async () => {
    await addRows(1);
    const id = (await queue.claim(database.prisma, 'a', waiting))?.id ?? '';
    expect(await queue.release(other, id, 'b', Prisma.sql`state = 'QUEUED'`)).toBe(false);
    expect(await row(id)).toMatchObject({ leaseOwner: 'a', state: 'RUNNING' });
    expect(await queue.release(database.prisma, id, 'a', Prisma.sql`state = 'QUEUED'`)).toBe(true);
    expect(await row(id)).toMatchObject({ leaseOwner: null, leaseUntil: null, state: 'QUEUED' });
    expect((await queue.claim(other, 'b', waiting))?.id).toBe(id);
  });

  it('renews only for its holder, pushing the deadline on, and only while the row still matches', async () => {
    await addRows(1);
    const id = (await queue.claim(database.prisma, 'a', waiting))?.id ?? '';
    await database.prisma.$executeRaw`UPDATE "LeaseProbe" SET "leaseUntil" = now() + interval '1 second'`;
    const before = (await row(id))?.leaseUntil?.getTime() ?? 0;
    expect(await queue.renew(other, id, 'b')).toBe(false);
    expect((await row(id))?.leaseUntil?.getTime()).toBe(before);
    expect(await queue.renew(database.prisma, id, 'a', Prisma.sql`state = 'RUNNING'`)).toBe(true);
    expect((await row(id))?.leaseUntil?.getTime()).toBeGreaterThan(before + 20_000);
    // A row its holder no longer works on (cancelled meanwhile) is not renewed.
    await database.prisma.$executeRaw`UPDATE "LeaseProbe" SET state = 'CANCELLED'`;
    expect(await queue.renew(database.prisma, id, 'a', Prisma.sql`state = 'RUNNING'`)).toBe(false);
  });

  it('claims without a holder column, for a lease that is only a deadline', async () => {
    const deadlines = new LeaseQueue({ table: 'LeaseProbe', leaseMs: 30_000, ownerColumn: null });
    await addRows(2);
    const claimable = Prisma.sql`state = 'QUEUED' AND ${deadlines.expired({ orNone: true })}`;
    const taken = await Promise.all([
      deadlines.claim(database.prisma, null, { claimable, order: Prisma.sql`id` }),
      deadlines.claim(other, null, { claimable, order: Prisma.sql`id` }),
      deadlines.claim(other, null, { claimable, order: Prisma.sql`id` }),
    ]);
    const ids = taken.flatMap((claimed) => (claimed ? [claimed.id] : []));
    expect(new Set(ids).size).toBe(2);
    expect(ids).toHaveLength(2);
  });
});
