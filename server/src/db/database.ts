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
  if (!url) {
    const embedded = await (started ?? startEmbeddedPostgres(embeddedDataDir(config.dataDir), log));
    stopEmbedded = embedded.stop;
    trouble = embedded.trouble;
    stopping = embedded.stopping;
    try {
      await createDatabaseIfMissing(embedded.url('postgres'), 'hangar');
    } catch (err) {
      await embedded.stop();
      throw err;
    }
    url = embedded.url('hangar');
  }
  try {
    await migrate(url, log);
  } catch (err) {
    await stopEmbedded?.();
    throw err;
  }
  const prisma = createPrisma(url, config.dbPoolSizes);
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
