import type { Logger } from '@hangar/common/log';
import type { Config } from '../config.js';
import { createPrisma, type Db } from './client.js';
import { createDatabaseIfMissing, type EmbeddedDatabase, embeddedDataDir, startEmbeddedPostgres } from './embedded.js';
import { migrate } from './migrate.js';

export type Database = {
  prisma: Db;
  url: string;
  embedded: boolean;
  close: () => Promise<void>;
  /** Why the embedded PostgreSQL is not serving now (it exited and is being restarted), for /readyz. */
  trouble?: () => string | null;
  /** The server has begun to stop: the embedded PostgreSQL is no longer restarted if it exits (close() follows). */
  stopping?: () => void;
};

/**
 * DATABASE_URL when set; otherwise the embedded PostgreSQL under the data dir, or the one main.ts began to start
 * (`started`) while the rest of the server was loading. Migrated before it is returned.
 */
export async function openDatabase(
  config: Config,
  log: Logger,
  started?: Promise<EmbeddedDatabase>,
): Promise<Database> {
  let url = config.databaseUrl;
  let stopEmbedded: (() => Promise<void>) | undefined;
  let trouble: (() => string | null) | undefined;
  let stopping: (() => void) | undefined;
  let adminUrl: string | undefined;
  if (!url) {
    const embedded = await (started ?? startEmbeddedPostgres(embeddedDataDir(config.dataDir), log));
    stopEmbedded = embedded.stop;
    trouble = embedded.trouble;
    stopping = embedded.stopping;
    adminUrl = embedded.url('postgres');
    url = embedded.url('hangar');
  }
  const databaseUrl = url;
  // The embedded database is made on the first start; every later one finds it (one connection, not two).
  const migrated = migrate(databaseUrl, log).catch(async (err: unknown) => {
    if (!adminUrl || (err as { code?: string }).code !== '3D000') throw err;
    await createDatabaseIfMissing(adminUrl, 'hangar');
    return migrate(databaseUrl, log);
  });
  // Beside the migrations' check, not after it: Prisma's query compiler loads (WebAssembly and the datamodel), and
  // each pool opens its first connection (a SCRAM exchange each: the migrations', the requests' and the loops' were
  // three of the start's round trips one after the other). `SELECT 1` reads no table the migrations change.
  const prisma = createPrisma(databaseUrl, config.dbPoolSizes);
  const opened = Promise.all([prisma.$queryRawUnsafe('SELECT 1'), prisma.loops.$queryRawUnsafe('SELECT 1')]);
  opened.catch(() => {});
  try {
    await migrated;
    // Its failure is one the first real query meets again, and says there (the pools retry a connection).
    await opened.catch((err: unknown) => log.debug('a pool could not open its first connection', { error: err }));
  } catch (err) {
    await prisma.$disconnect().catch(() => {});
    await stopEmbedded?.();
    throw err;
  }
  return {
    prisma,
    url,
    embedded: Boolean(stopEmbedded),
    trouble,
    stopping,
    close: async () => {
      await prisma.$disconnect();
      await stopEmbedded?.();
    },
  };
}
