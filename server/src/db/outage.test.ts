import { freePort } from '@hangar/common/free-port';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../../test/harness.js';
import { createPrisma } from './client.js';
import type { Database } from './database.js';
import { isDatabaseUnreachable, LoopHealth, Stopped } from './outage.js';

// What counts as "the database is away" decides whether a loop pauses (and fails nothing) or reports a bug, so
// it is checked against the errors the real clients throw, not against hand-made ones.

let database: Database;
beforeAll(async () => {
  database = await freshDatabase();
});
afterAll(async () => {
  await database?.close();
});

const nowhere = async () => `postgresql://postgres:x@127.0.0.1:${await freePort()}/hangar`;

describe('isDatabaseUnreachable', () => {
  it('is true for a server that refuses connections, through Prisma and through node-postgres', async () => {
    const prisma = createPrisma(await nowhere());
    const viaPrisma = await prisma.$queryRaw`SELECT 1`.catch((e: unknown) => e);
    await prisma.$disconnect();
    expect(isDatabaseUnreachable(viaPrisma)).toBe(true);
    const client = new pg.Client({ connectionString: await nowhere() });
    const viaPg = await client.connect().catch((e: unknown) => e);
    expect(isDatabaseUnreachable(viaPg)).toBe(true);
  });

  it('is true for a write a standby refuses (the session reached the old primary, now read-only)', async () => {
    // A hot standby refuses writes with SQLSTATE 25006, as any read-only transaction does: here, one made so.
    const viaPrisma = await database.prisma
      .$transaction(async (tx) => {
        await tx.$executeRawUnsafe('SET TRANSACTION READ ONLY');
        await tx.user.create({ data: { email: 'ro@example.com', name: 'RO', passwordHash: 'x', role: 'VIEWER' } });
      })
      .catch((e: unknown) => e);
    expect(String(viaPrisma)).toMatch(/read-only transaction/);
    expect(isDatabaseUnreachable(viaPrisma)).toBe(true);
    const client = new pg.Client({ connectionString: database.url });
    await client.connect();
    const viaPg = await client
      .query('BEGIN READ ONLY')
      .then(() =>
        client.query(
          `INSERT INTO "User" (id, email, name, "passwordHash", role) VALUES (gen_random_uuid(), 'ro2@example.com', 'RO', 'x', 'VIEWER')`,
        ),
      )
      .catch((e: unknown) => e);
    await client.end();
    expect((viaPg as { code?: string }).code).toBe('25006');
    expect(isDatabaseUnreachable(viaPg)).toBe(true);
  });

  it('is true for a session the server ends (an administrator, a restart)', async () => {
    const victim = new pg.Client({ connectionString: database.url });
    victim.on('error', () => {});
    await victim.connect();
    const { rows } = await victim.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    const pending = victim.query('SELECT pg_sleep(10)').catch((e: unknown) => e);
    await database.prisma.$executeRawUnsafe(`SELECT pg_terminate_backend(${rows[0]?.pid})`);
    expect(isDatabaseUnreachable(await pending)).toBe(true);
    await victim.end().catch(() => {});
  });

  it('is false for a query that is wrong, and for errors that are not the database', async () => {
    const wrong = await database.prisma.$queryRawUnsafe('SELECT * FROM "NoSuchTable"').catch((e: unknown) => e);
    expect(isDatabaseUnreachable(wrong)).toBe(false);
    const unique = await database.prisma.user
      .create({ data: { email: 'dup@example.com', name: 'Dup', passwordHash: 'x', role: 'VIEWER' } })
      .then(() =>
        database.prisma.user.create({
          data: { email: 'dup@example.com', name: 'Dup', passwordHash: 'x', role: 'VIEWER' },
        }),
      )
      .catch((e: unknown) => e);
    expect((unique as { code?: string }).code).toBe('P2002');
    expect(isDatabaseUnreachable(unique)).toBe(false);
    expect(isDatabaseUnreachable(new Error('the upstream answered HTTP 503'))).toBe(false);
    expect(isDatabaseUnreachable(undefined)).toBe(false);
  });
});

describe('LoopHealth', () => {
  it('logs an outage once however many tries fail, backs off, and logs the return once', async () => {
    const lines: string[] = [];
    const health = new LoopHealth(
      'test loop',
      createLogger('info', (l) => lines.push(l)),
      () => 0,
    );
    const prisma = createPrisma(await nowhere());
    const refused = await prisma.$queryRaw`SELECT 1`.catch((e: unknown) => e);
    await prisma.$disconnect();
    for (let i = 0; i < 5; i++) expect(health.failed(refused)).toBe(true);
    expect(health.paused?.reason).toContain("Can't reach database server");
    expect(health.failed(new Error('a bug'))).toBe(false);
    health.ok();
    health.ok();
    expect(health.paused).toBeNull();
    expect(lines.map((l) => JSON.parse(l).msg)).toEqual([
      'test loop: the database is unreachable; paused until it answers again',
      'test loop: the database is back; resumed',
    ]);
  });

  it('tries again at once when another loop finds the database back, not after its own backoff', async () => {
    // Backoffs of a minute: only the wake can make these due again within the test.
    const placement = new LoopHealth('placement', undefined, () => 60_000);
    const downloads = new LoopHealth('downloads', undefined, () => 60_000);
    const prisma = createPrisma(await nowhere());
    const refused = await prisma.$queryRaw`SELECT 1`.catch((e: unknown) => e);
    await prisma.$disconnect();
    expect(placement.failed(refused)).toBe(true);
    expect(downloads.failed(refused)).toBe(true);
    expect([placement.due(), downloads.due()]).toEqual([false, false]);
    // Placement ticks every 5 s: its pass is run when the database is back, not at its next tick.
    let passes = 0;
    placement.whenBack(() => passes++);
    // The downloads' next try got through.
    downloads.ok();
    expect(placement.due()).toBe(true);
    await expect.poll(() => passes).toBe(1);
    expect(placement.paused).not.toBeNull();
    placement.ok();
    expect(placement.paused).toBeNull();
  });

  it('retries a write until it gets through, and gives up with Stopped on shutdown', async () => {
    const health = new LoopHealth('writes', undefined, () => 1);
    const prisma = createPrisma(await nowhere());
    const refused = await prisma.$queryRaw`SELECT 1`.catch((e: unknown) => e);
    await prisma.$disconnect();
    let tries = 0;
    const value = await health.until(
      async () => {
        if (++tries < 3) throw refused;
        return 'written';
      },
      () => false,
    );
    expect({ value, tries }).toEqual({ value: 'written', tries: 3 });
    let stopping = false;
    const stopped = health.until(
      async () => {
        stopping = true;
        throw refused;
      },
      () => stopping,
    );
    await expect(stopped).rejects.toBeInstanceOf(Stopped);
    await expect(
      health.until(
        () => Promise.reject(new Error('a bug')),
        () => false,
      ),
    ).rejects.toThrow('a bug');
  });
});
