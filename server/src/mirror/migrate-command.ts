import { createLogger } from '@hangar/common/log';
import { AuditService } from '../audit/audit.service.js';
import { ConfigError, loadConfig } from '../config.js';
import { type Database, openDatabase } from '../db/database.js';
import { MigrationError } from '../db/migrate.js';
import { MirrorMigrationError, migrateMirrorToBucket } from './migrate-to-bucket.js';
import { MirrorPaths } from './paths.js';
import { MirrorStorageError } from './storage.js';
import { type MirrorStore, MirrorStoreConfigError, openMirrorStore, parseStoreSpec } from './store/store.js';

// `hangar mirror migrate --to s3://bucket/prefix` (bin/hangar.mjs sends it here, not to the CLI: it needs the
// database and the data dir, as the server's own start does, so it runs where the server runs, with the server's
// environment, while every server is stopped). See migrate-to-bucket.ts for what it does.

const USAGE =
  'usage: hangar mirror migrate --to s3://bucket/prefix\n' +
  "  moves the `file` mirror under HANGAR_DATA_DIR into the bucket (stop every server first; run with the server's\n" +
  '  environment: DATABASE_URL or the embedded database, HANGAR_DATA_DIR, AWS_* and HANGAR_S3_FORCE_PATH_STYLE)';

/** Runs the command; answers the exit status (0 done, 2 refused or wrong usage, 1 failed). */
export async function runMirrorMigrate(
  args: string[],
  o: {
    env?: NodeJS.ProcessEnv;
    print?: (line: string) => void;
    /** The bucket as opened: tests wrap it (to cut a run off half-way). */
    wrapStore?: (store: MirrorStore) => MirrorStore;
  } = {},
): Promise<number> {
  const print = o.print ?? ((line: string) => process.stdout.write(`${line}\n`));
  const i = args.findIndex((a) => a === '--to' || a.startsWith('--to='));
  const flag = i < 0 ? undefined : args[i];
  const to = flag?.startsWith('--to=') ? flag.slice(5) : flag ? args[i + 1] : undefined;
  if (args.includes('--help') || args.includes('-h')) {
    print(USAGE);
    return 0;
  }
  let spec: ReturnType<typeof parseStoreSpec>;
  let config: ReturnType<typeof loadConfig>;
  try {
    spec = parseStoreSpec(to);
    if (!to || spec.kind !== 's3') {
      print(
        `--to ${JSON.stringify(to ?? '')}: name the bucket to move the mirror into, as s3://bucket/prefix\n${USAGE}`,
      );
      return 2;
    }
    config = loadConfig(o.env ?? process.env);
  } catch (err) {
    if (err instanceof MirrorStoreConfigError || err instanceof ConfigError) {
      print(`--to: ${err.message.replace(/^HANGAR_MIRROR_STORE=/, '')}`);
      return 2;
    }
    throw err;
  }
  if (config.mirrorStore.kind === 's3') {
    print(
      'HANGAR_MIRROR_STORE is s3://… in this environment: run this with the environment of the servers as they are now (on `file`), and set HANGAR_MIRROR_STORE to the bucket once it is done',
    );
    return 2;
  }
  const log = createLogger(config.logLevel);
  let db: Database | undefined;
  let bucket: MirrorStore | undefined;
  try {
    db = await openDatabase(config, log);
    const paths = new MirrorPaths(config.dataDir);
    bucket = await openMirrorStore({
      spec,
      root: paths.root,
      db: db.prisma,
      forcePathStyle: config.s3ForcePathStyle,
    });
    const store = o.wrapStore ? o.wrapStore(bucket) : bucket;
    const r = await migrateMirrorToBucket({
      db: db.prisma,
      paths,
      bucket: store,
      audit: new AuditService(db.prisma, log),
      log,
      print,
    });
    print(
      r.already
        ? `the mirror is on ${store.where} already (storage ${r.storageId}): nothing to do`
        : `done: ${r.files} mirror files are on ${store.where} now (storage ${r.storageId}); ${r.copied} blobs copied, ${r.skipped} were there already.\n` +
            `Start the servers with HANGAR_MIRROR_STORE=${to}${config.s3ForcePathStyle ? ' and HANGAR_S3_FORCE_PATH_STYLE=true' : ''}. ` +
            `The copies under ${paths.files} are left in place: delete them once the servers serve from the bucket.`,
    );
    return 0;
  } catch (err) {
    if (err instanceof MirrorMigrationError || err instanceof MirrorStorageError || err instanceof MigrationError) {
      print(`the mirror was not moved: ${err.message}`);
      return 2;
    }
    print(
      `the mirror was not moved: ${(err as Error).message ?? String(err)}. Where the bucket is what failed, check --to, AWS_ENDPOINT_URL, AWS_REGION, the credentials and HANGAR_S3_FORCE_PATH_STYLE. Run it again: the blobs already in the bucket are not copied again.`,
    );
    return 1;
  } finally {
    bucket?.close();
    await db?.close();
  }
}
