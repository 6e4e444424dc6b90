import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import type { Db } from '../db/client.js';
import type { MirrorPaths } from './paths.js';
import { type MirrorStore, openMirrorStore, type StoreSpec } from './store/store.js';

// Which storage the mirror's bytes are on. Replicas that share a database must share the mirror's storage; a
// replica started on other storage (another HANGAR_DATA_DIR, or a mount that is not there yet) would otherwise
// find none of the files the database lists and fail them all as "removed by hand". The id is written once into
// the mirror's root, so it travels with the storage, and each file row records the id it was written on.

/** The mirror cannot start on this storage: the message says why and what to do. Nothing was changed. */
export class MirrorStorageError extends Error {
  override name = 'MirrorStorageError';
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;

/** The id in `file`, or null when there is none. */
export async function readStorageId(file: string): Promise<string | null> {
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new MirrorStorageError(
      `${file} cannot be read (${(err as Error).message}): the mirror's storage id is kept there`,
    );
  }
  const id = text.trim();
  if (!ID.test(id))
    throw new MirrorStorageError(
      `${file} holds ${JSON.stringify(id.slice(0, 100))}, which is not a storage id: one line of letters, digits, '.', '_' and '-' (up to 100), as Hangar wrote it`,
    );
  return id;
}

/**
 * Writes a new id into `file`, unless another replica on the same storage wrote one first (then that one is
 * answered). A link from a complete temporary file, so a replica starting at the same moment never reads half an id.
 */
export async function createStorageId(file: string): Promise<string> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const id = randomUUID();
  const tmp = `${file}.${process.pid}.${id.slice(0, 8)}.tmp`;
  const fh = await fs.open(tmp, 'w');
  try {
    await fh.writeFile(`${id}\n`);
    await fh.datasync();
  } finally {
    await fh.close();
  }
  try {
    await fs.link(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return (await readStorageId(file)) as string;
  } finally {
    await fs.rm(tmp, { force: true });
  }
  return id;
}

/** Whether `dir` exists and holds anything. */
export async function holdsAnything(dir: string): Promise<boolean> {
  try {
    return (await fs.readdir(dir)).length > 0;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

/**
 * This replica's mirror storage: its id, known once open() has accepted it. Every row the mirror writes records
 * it, and the workers take up only partials on it. Shared by the parts of the mirror service, read through `id`.
 */
export class MirrorStorage {
  /** Null until open(): nothing is claimed or judged before the storage is known. */
  id: string | null = null;
  /**
   * The bucket the mirror's bytes are kept in (HANGAR_MIRROR_STORE=s3://…), known once open(); null on `file`,
   * where every part goes on using the data dir as before (mirror/on-bucket.ts holds the bucket's side).
   */
  bucket: MirrorStore | null = null;
  private readonly db: Db;
  private readonly paths: MirrorPaths;
  private readonly dataDir: string;
  private readonly log: Logger;
  private readonly spec: StoreSpec;
  private readonly forcePathStyle: boolean;

  constructor(o: {
    db: Db;
    paths: MirrorPaths;
    dataDir: string;
    log: Logger;
    /** HANGAR_MIRROR_STORE; none is `file`. */
    store?: StoreSpec;
    forcePathStyle?: boolean;
  }) {
    this.db = o.db;
    this.paths = o.paths;
    this.dataDir = o.dataDir;
    this.log = o.log;
    this.spec = o.store ?? { kind: 'file' };
    this.forcePathStyle = o.forcePathStyle ?? false;
  }

  /**
   * Finds this replica's mirror storage, or refuses to start (MirrorStorageError, nothing changed) when the
   * database's mirror is on storage this replica cannot see: another HANGAR_DATA_DIR, or a mount that is not
   * there. Either way, judging the files from here would fail every one of them. Run before the workers start.
   */
  async open() {
    if (this.spec.kind === 's3') return this.openBucket(this.spec);
    const root = this.paths.root;
    const idFile = this.paths.storageIdFile;
    const where = `${root} (HANGAR_DATA_DIR=${this.dataDir})`;
    // The way on when the old storage is lost for good: this one takes its id, and start() fails what it lacks.
    const gone = (id: string) =>
      `If storage ${id} is gone for good and this one replaces it, write ${id} into ${idFile} and start again: the files missing here are then marked FAILED, and retry fetches them again.`;
    // Under a lock, so two replicas starting at once on fresh rows cannot both adopt them.
    const id = await this.db.$transaction(
      async (tx) => {
        await tx.$executeRaw`SELECT pg_advisory_xact_lock(hashtext('hangar.mirror.storage'))`;
        const recorded = (
          await tx.mirrorFile.groupBy({ by: ['storageId'], where: { storageId: { not: null } }, _count: true })
        )
          .map((g) => ({ id: g.storageId as string, files: g._count }))
          .sort((a, b) => a.id.localeCompare(b.id));
        const listed = (ids: typeof recorded) => ids.map((r) => `${r.id} (${r.files} files)`).join(', ');
        let id = await readStorageId(idFile);
        if (!id) {
          if (recorded.length)
            throw new MirrorStorageError(
              `the mirror's storage seems missing: ${idFile} is not there, but the database's mirror is on storage ${listed(recorded)}. ` +
                `Replicas that share a database share one mirror storage: mount it at ${where}, or point HANGAR_DATA_DIR at where it is mounted, and start again. Nothing was changed.${recorded.length === 1 ? ` ${gone(recorded[0]?.id as string)}` : ''}`,
            );
          const unrecorded = await tx.mirrorFile.count({ where: { state: 'PRESENT', storageId: null } });
          if (unrecorded && !(await holdsAnything(this.paths.files)))
            throw new MirrorStorageError(
              `the mirror's storage seems missing: the database lists ${unrecorded} present files, but ${where} holds none of them and no ${path.basename(idFile)}. ` +
                `Mount the mirror's storage there, or point HANGAR_DATA_DIR at it, and start again. Nothing was changed. If the files are gone for good, write a new id into ${idFile} (uuidgen > ${idFile}) and start again: the missing files are then marked FAILED, and retry fetches them again.`,
            );
          id = await createStorageId(idFile);
          this.log.info('the mirror storage has an id now', { storage: id, root });
        }
        const others = recorded.filter((r) => r.id !== id);
        if (others.length) {
          const onThisOne = recorded.find((r) => r.id === id);
          throw new MirrorStorageError(
            `this replica's mirror storage is ${id} at ${where}, but the database's mirror holds files on storage ${listed(others)}${onThisOne ? ` (and ${onThisOne.files} on this one)` : ''}, which this replica cannot see. ` +
              `Replicas that share a database share one mirror storage: start this one with HANGAR_DATA_DIR on that shared filesystem (its ${path.basename(idFile)} reads ${others.map((o) => o.id).join(' or ')}). Nothing was changed.${onThisOne || others.length > 1 ? '' : ` ${gone(others[0]?.id as string)}`}`,
          );
        }
        // Rows from before storages had ids are taken as on the first storage that starts with them (this one):
        // the files missing from it are then judged by start() as before.
        const adopted = await tx.mirrorFile.updateMany({ where: { storageId: null }, data: { storageId: id } });
        if (adopted.count)
          this.log.info('mirror files recorded before storage ids are on this storage', {
            storage: id,
            files: adopted.count,
          });
        return id;
      },
      { timeout: 30_000 },
    );
    this.id = id;
  }

  /**
   * On a bucket the id is the bucket's own (an object beside the blobs, written once by the first replica), so
   * replicas with separate data dirs find the same one; files recorded on another storage are refused as above.
   */
  private async openBucket(spec: Extract<StoreSpec, { kind: 's3' }>) {
    const store = await openMirrorStore({
      spec,
      root: this.paths.root,
      db: this.db,
      forcePathStyle: this.forcePathStyle,
    });
    // The bucket's id when a replica wrote one; else this replica writes it (claim answers whichever holds).
    const id = await store
      .storageId()
      .then((known) => known ?? store.claimStorageId())
      .catch((err: Error) => {
        store.close();
        throw new MirrorStorageError(
          `the mirror's bucket ${store.where} cannot be reached (${err.message}): check HANGAR_MIRROR_STORE, AWS_ENDPOINT_URL, AWS_REGION and the credentials, and start again. Nothing was changed.`,
        );
      });
    const others = await this.db.mirrorFile.groupBy({
      by: ['storageId'],
      where: { storageId: { not: id } },
      _count: true,
    });
    if (others.length) {
      store.close();
      throw new MirrorStorageError(
        `this replica's mirror storage is the bucket ${store.where} (${id}), but the database's mirror holds files on ${others.map((o) => `${o.storageId ?? 'storage without an id'} (${o._count} files)`).join(', ')}. Replicas that share a database share one mirror storage: start this one with the same HANGAR_MIRROR_STORE as the others. Nothing was changed.`,
      );
    }
    this.bucket = store;
    this.id = id;
    this.log.info('the mirror keeps its files in a bucket', { storage: id, store: store.where });
  }
}
