import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../../test/harness.js';
import { installModelEvents } from '../catalog/model-events.js';
import type { Database } from './database.js';
import { installTriggers, isDeadlock, type TriggerSet } from './triggers.js';

let db: Database;
let other: pg.Client;

beforeAll(async () => {
  db = await freshDatabase();
  other = new pg.Client({ connectionString: db.url, application_name: 'triggers test' });
  await other.connect();
  await db.prisma.$executeRawUnsafe('CREATE TABLE "Thing" (id int PRIMARY KEY, seen int NOT NULL DEFAULT 0)');
});
afterAll(async () => {
  await other?.end();
  await db?.close();
});

const oid = async (name: string) =>
  (await other.query<{ oid: number }>('SELECT oid FROM pg_trigger WHERE tgname = $1', [name])).rows[0]?.oid;

const counting = (add: number): TriggerSet => ({
  lock: 0x74657374,
  functions: [
    `CREATE OR REPLACE FUNCTION thing_seen() RETURNS trigger AS $$
     BEGIN NEW.seen := NEW.seen + ${add}; RETURN NEW; END $$ LANGUAGE plpgsql`,
  ],
  triggers: [
    {
      name: 'Thing_seen',
      table: 'Thing',
      create: `CREATE TRIGGER "Thing_seen" BEFORE INSERT ON "Thing" FOR EACH ROW EXECUTE FUNCTION thing_seen()`,
    },
  ],
});

describe('triggers installed at start', () => {
  it('leaves a trigger this version already installed alone, and replaces one whose definition changed', async () => {
    expect(await installTriggers(db.prisma, counting(1))).toBe(true);
    const first = await oid('Thing_seen');
    expect(await installTriggers(db.prisma, counting(1))).toBe(false);
    expect(await oid('Thing_seen')).toBe(first);

    expect(await installTriggers(db.prisma, counting(10))).toBe(true);
    expect(await oid('Thing_seen')).not.toBe(first);
    await other.query('INSERT INTO "Thing" (id) VALUES (1)');
    expect((await other.query('SELECT seen FROM "Thing" WHERE id = 1')).rows[0].seen).toBe(10);

    // Dropped behind its back (a restore without triggers): the next start puts it back.
    await other.query('DROP TRIGGER "Thing_seen" ON "Thing"');
    expect(await installTriggers(db.prisma, counting(10))).toBe(true);
    expect(await oid('Thing_seen')).toBeDefined();
  });

  it('starts beside a server whose open transaction writes the tables, without waiting for it', async () => {
    // A running server's transaction holds ROW EXCLUSIVE on Replica; replacing the triggers needs ACCESS
    // EXCLUSIVE and would wait for it (and, across tables, deadlock with it). Already installed, nothing waits.
    await installModelEvents(db.prisma);
    await other.query('BEGIN');
    await other.query('LOCK TABLE "Replica" IN ROW EXCLUSIVE MODE');
    try {
      const outcome = await Promise.race([
        installModelEvents(db.prisma).then(() => 'started'),
        new Promise((resolve) => setTimeout(() => resolve('blocked behind the open transaction'), 15_000)),
      ]);
      expect(outcome).toBe('started');
    } finally {
      await other.query('ROLLBACK');
    }
  });

  it('knows PostgreSQL’s deadlock however it is wrapped', () => {
    expect(isDeadlock({ code: '40P01' })).toBe(true);
    expect(isDeadlock(new Error('Raw query failed. Code: `40P01`. Message: `deadlock detected`'))).toBe(true);
    expect(isDeadlock({ meta: { driverAdapterError: { cause: { code: '40P01' } } } })).toBe(true);
    expect(isDeadlock({ code: '23505' })).toBe(false);
  });
});
