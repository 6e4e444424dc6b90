import { createHash, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import pg from 'pg';

// Prisma's CLI downloads a native engine before it migrates, which an air-gapped site cannot do. So the server
// applies prisma/migrations/*/migration.sql itself and records each in _prisma_migrations exactly as Prisma
// does, so `prisma migrate status` elsewhere still reads the history correctly.

export const migrationsDir = path.resolve(new URL('../../../prisma/migrations', import.meta.url).pathname);

// Any constant will do, so long as every Hangar replica uses the same one: it serialises replicas starting together.
export const LOCK_KEY = 0x68616e67; // "hang"

export class MigrationError extends Error {
  override name = 'MigrationError';
}

export type Migration = { name: string; sql: string; checksum: string };

export async function readMigrations(dir = migrationsDir): Promise<Migration[]> {
  if (!existsSync(dir)) return [];
  const names = (await fs.readdir(dir, { withFileTypes: true }))
    .filter((e) => e.isDirectory())
    .map((e) => e.name)
    .sort();
  const out: Migration[] = [];
  for (const name of names) {
    const file = path.join(dir, name, 'migration.sql');
    if (!existsSync(file)) continue;
    const sql = await fs.readFile(file, 'utf8');
    out.push({ name, sql, checksum: createHash('sha256').update(sql).digest('hex') });
  }
  return out;
}

const createTable = `CREATE TABLE IF NOT EXISTS "_prisma_migrations" (
  "id" VARCHAR(36) PRIMARY KEY NOT NULL,
  "checksum" VARCHAR(64) NOT NULL,
  "finished_at" TIMESTAMPTZ,
  "migration_name" VARCHAR(255) NOT NULL,
  "logs" TEXT,
  "rolled_back_at" TIMESTAMPTZ,
  "started_at" TIMESTAMPTZ NOT NULL DEFAULT now(),
  "applied_steps_count" INTEGER NOT NULL DEFAULT 0
)`;

type Applied = { migration_name: string; checksum: string; finished_at: Date | null; rolled_back_at: Date | null };

/** Applies every migration not yet applied; returns the names it applied. */
export async function migrate(databaseUrl: string, log: Logger, dir = migrationsDir): Promise<string[]> {
  const client = new pg.Client({ connectionString: databaseUrl });
  // The files are read while the connection is made.
  const connected = client.connect();
  // Met below (after the files), not an unhandled rejection meanwhile: no database yet is an answer (database.ts).
  connected.catch(() => {});
  const migrations = await readMigrations(dir).catch(async (err: unknown) => {
    await connected.then(
      () => client.end(),
      () => {},
    );
    throw err;
  });
  await connected;
  try {
    // Nearly every start finds the database as this build left it: one read says so, without the lock (which
    // waits for a replica that is migrating) and the table's DDL. Anything else (a migration to apply, an edited or
    // unknown one, one never finished) goes the locked way below, which decides and says why.
    if (await atLatest(client, migrations)) return [];
    await client.query('SELECT pg_advisory_lock($1)', [LOCK_KEY]);
    await client.query(createTable);
    const { rows } = await client.query<Applied>(
      'SELECT migration_name, checksum, finished_at, rolled_back_at FROM "_prisma_migrations" WHERE rolled_back_at IS NULL',
    );
    const applied = new Map(rows.map((r) => [r.migration_name, r]));
    const known = new Set(migrations.map((m) => m.name));
    for (const row of rows) {
      if (!row.finished_at) {
        throw new MigrationError(
          `migration ${row.migration_name} was started and never finished: the database needs a look by hand before Hangar may change it again`,
        );
      }
      if (!known.has(row.migration_name)) {
        throw new MigrationError(
          `the database has migration ${row.migration_name}, which this build of Hangar does not have: it was migrated by a newer version; run that version or restore a backup`,
        );
      }
    }
    const done: string[] = [];
    for (const m of migrations) {
      const row = applied.get(m.name);
      if (row) {
        if (row.checksum !== m.checksum) {
          throw new MigrationError(
            `migration ${m.name} was changed after it was applied (checksum ${row.checksum.slice(0, 12)}… in the database, ${m.checksum.slice(0, 12)}… on disk): restore the file as it was; a change to the schema goes in a new migration (pnpm migration:new)`,
          );
        }
        continue;
      }
      const started = Date.now();
      // One transaction per migration: a failure leaves neither a half-changed schema nor a row claiming it ran.
      await client.query('BEGIN');
      try {
        await client.query(m.sql);
        await client.query(
          `INSERT INTO "_prisma_migrations" (id, checksum, migration_name, started_at, finished_at, applied_steps_count)
           VALUES ($1, $2, $3, $4, now(), 1)`,
          [randomUUID(), m.checksum, m.name, new Date(started)],
        );
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK');
        throw new MigrationError(`migration ${m.name} failed and was rolled back: ${(err as Error).message}`);
      }
      log.info('applied migration', { migration: m.name, ms: Date.now() - started });
      done.push(m.name);
    }
    return done;
  } finally {
    await client.query('SELECT pg_advisory_unlock_all()').catch(() => {});
    await client.end();
  }
}

/** Whether the database has exactly this build's migrations, each finished and unchanged. */
async function atLatest(client: pg.Client, migrations: Migration[]): Promise<boolean> {
  // No table yet (a new database): not at the latest, and the locked way creates it.
  const found = await client
    .query<Applied>(
      'SELECT migration_name, checksum, finished_at, rolled_back_at FROM "_prisma_migrations" WHERE rolled_back_at IS NULL',
    )
    .catch(() => null);
  if (!found || found.rows.length !== migrations.length) return false;
  const applied = new Map(found.rows.map((r) => [r.migration_name, r]));
  return migrations.every((m) => {
    const row = applied.get(m.name);
    return Boolean(row?.finished_at) && row?.checksum === m.checksum;
  });
}

// The names of a build's migrations do not change while it runs: read once per directory, not at every probe.
const names = new Map<string, Promise<string[]>>();

/** Whether every migration this build has is applied: what /readyz reports. */
export async function pendingMigrations(
  query: (sql: string) => Promise<{ migration_name: string }[]>,
  dir = migrationsDir,
) {
  let known = names.get(dir);
  if (!known) {
    known = readMigrations(dir).then((ms) => ms.map((m) => m.name));
    names.set(dir, known);
    known.catch(() => names.delete(dir));
  }
  const rows = await query(
    'SELECT migration_name FROM "_prisma_migrations" WHERE finished_at IS NOT NULL AND rolled_back_at IS NULL',
  );
  const applied = new Set(rows.map((r) => r.migration_name));
  return (await known).filter((name) => !applied.has(name));
}
