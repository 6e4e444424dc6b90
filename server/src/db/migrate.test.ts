import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase } from '../../test/harness.js';
import type { Database } from './database.js';
import { LOCK_KEY, MigrationError, migrate, migrationsDir, readMigrations } from './migrate.js';

const log = createLogger('silent');
let db: Database;
beforeAll(async () => {
  db = await freshDatabase(); // already migrated once, as the server does at start
});
afterAll(() => db.close());

async function rows(url: string) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (
      await c.query(
        'SELECT migration_name, checksum, finished_at, applied_steps_count FROM "_prisma_migrations" ORDER BY migration_name',
      )
    ).rows;
  } finally {
    await c.end();
  }
}

describe('the offline migration runner', () => {
  it('records each migration the way Prisma does', async () => {
    const local = await readMigrations();
    expect(local.length).toBeGreaterThan(0);
    const recorded = await rows(db.url);
    expect(recorded.map((r) => [r.migration_name, r.checksum, r.applied_steps_count])).toEqual(
      local.map((m) => [m.name, m.checksum, 1]),
    );
    expect(recorded.every((r) => r.finished_at instanceof Date)).toBe(true);
  });

  it('applies nothing twice, even when two servers start together', async () => {
    const [a, b] = await Promise.all([migrate(db.url, log), migrate(db.url, log)]);
    expect([...a, ...b]).toEqual([]);
    expect((await rows(db.url)).length).toBe((await readMigrations()).length);
  });

  it('finds a database at the latest migration in one read, without waiting for the lock', async () => {
    // Another server holds the migrations' lock (migrating, or stuck there): a start with nothing to apply goes on.
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('SELECT pg_advisory_lock($1)', [LOCK_KEY]);
    try {
      // Waiting for the lock fails here (lock_timeout) instead of hanging the test.
      const url = new URL(db.url);
      url.searchParams.set('options', '-c lock_timeout=3000');
      expect(await migrate(url.toString(), log)).toEqual([]);
    } finally {
      await holder.end();
    }
  });

  it('still refuses a migration that was started and never finished, all names being there', async () => {
    const fresh = await freshDatabase();
    const c = new pg.Client({ connectionString: fresh.url });
    await c.connect();
    const last = (await readMigrations()).at(-1)?.name;
    await c.query('UPDATE "_prisma_migrations" SET finished_at = NULL WHERE migration_name = $1', [last]);
    await c.end();
    await expect(migrate(fresh.url, log)).rejects.toThrow(`migration ${last} was started and never finished`);
    await fresh.close();
  });

  it('lets only one of two racing servers apply a fresh database', async () => {
    const fresh = await freshDatabase();
    const c = new pg.Client({ connectionString: fresh.url });
    await c.connect();
    await c.query('DROP SCHEMA public CASCADE; CREATE SCHEMA public;');
    await c.end();
    const [a, b] = await Promise.all([migrate(fresh.url, log), migrate(fresh.url, log)]);
    expect([...a, ...b].sort()).toEqual((await readMigrations()).map((m) => m.name));
    await fresh.close();
  });

  it('refuses to start when an applied migration was edited', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-migrations-'));
    await fs.cp(migrationsDir, dir, { recursive: true });
    const first = (await readMigrations(dir))[0]!;
    await fs.appendFile(path.join(dir, first.name, 'migration.sql'), '\n-- edited after the fact\n');
    await expect(migrate(db.url, log, dir)).rejects.toThrow(MigrationError);
    await expect(migrate(db.url, log, dir)).rejects.toThrow(
      new RegExp(
        `migration ${first.name} was changed after it was applied .* a change to the schema goes in a new migration`,
      ),
    );
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('refuses a database migrated by a newer Hangar', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-migrations-'));
    await fs.cp(migrationsDir, dir, { recursive: true });
    await fs.mkdir(path.join(dir, '99990101000000_from_the_future'));
    await fs.writeFile(
      path.join(dir, '99990101000000_from_the_future', 'migration.sql'),
      'CREATE TABLE "Future" (id int);',
    );
    expect(await migrate(db.url, log, dir)).toEqual(['99990101000000_from_the_future']);
    await expect(migrate(db.url, log)).rejects.toThrow(/which this build of Hangar does not have/);
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('rolls back a failing migration and records nothing', async () => {
    const fresh = await freshDatabase();
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-migrations-'));
    await fs.cp(migrationsDir, dir, { recursive: true });
    await fs.mkdir(path.join(dir, '99990101000000_broken'));
    await fs.writeFile(
      path.join(dir, '99990101000000_broken', 'migration.sql'),
      'CREATE TABLE "Half" (id int); ALTER TABLE "Nope" ADD x int;',
    );
    await expect(migrate(fresh.url, log, dir)).rejects.toThrow(
      /migration 99990101000000_broken failed and was rolled back/,
    );
    const c = new pg.Client({ connectionString: fresh.url });
    await c.connect();
    const half = await c.query(`SELECT to_regclass('"Half"') AS t`);
    await c.end();
    expect(half.rows[0].t).toBeNull();
    expect((await rows(fresh.url)).map((r) => r.migration_name)).not.toContain('99990101000000_broken');
    await fs.rm(dir, { recursive: true, force: true });
    await fresh.close();
  });
});
