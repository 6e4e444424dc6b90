import type { Readable } from 'node:stream';
import type { Db } from '../../db/client.js';

// Where the mirror's bytes are kept, by their sha256: a directory under the data dir (`file`, today's) or an
// S3-compatible bucket (`s3://bucket/prefix`: AWS S3, MinIO, Ceph RGW, GCS's S3 API). Content-addressed, so the
// same bytes are kept once however many versions list them, and a replica that shares only the database and the
// bucket finds every file by the sha256 its row records. Writes are resumable: a crash (kill -9) loses at most
// what came since the last checkpoint, never the whole file.

/** A blob being written. Bytes are hashed as they are written: the sha256 is Hangar's own, never an ETag. */
export interface BlobWrite {
  /** Bytes accepted so far: where the next byte goes (and a resumed fetch's Range begins). */
  readonly offset: number;
  write(chunk: Uint8Array): Promise<void>;
  /**
   * The bytes are whole: kept under their sha256 (or found already kept: `held`), and the write's own state
   * (partial, multipart upload, checkpoint) is gone.
   */
  finish(): Promise<{ sha256: string; size: number; held: boolean }>;
  /** Stops writing and keeps what was checkpointed, for a later openWrite of the same id (pause, shutdown). */
  close(): Promise<void>;
  /** Stops writing and throws away everything of this write (cancel, a file that did not verify). */
  discard(): Promise<void>;
}

export type StoreUsage = {
  /** Bytes the kept blobs take. */
  usedBytes: number;
  /** Room left: the disk's free bytes, or null where the store has no limit to tell (a bucket). */
  freeBytes: number | null;
};

export interface MirrorStore {
  readonly kind: 'file' | 's3';
  /** Where the bytes are, for messages: a directory, or s3://bucket/prefix. */
  readonly where: string;
  /** A write under this id: a new one, or the one a crash or a pause left, continued from its last checkpoint. */
  openWrite(id: string): Promise<BlobWrite>;
  /** The kept blob's size, or null when there is none with this sha256. */
  stat(sha256: string): Promise<{ size: number } | null>;
  /** The blob's bytes, or those from `start` to `end` inclusive (HTTP's Range). */
  read(sha256: string, range?: { start: number; end: number }): Promise<Readable>;
  /** Deletes the blob (the caller knows no version lists it any more); nothing when there is none. */
  remove(sha256: string): Promise<void>;
  usage(): Promise<StoreUsage>;
  /** The id written in the store itself (see ../storage.ts), or null when none was written yet. */
  storageId(): Promise<string | null>;
  /** Writes a new id into the store unless another replica wrote one first: the one that holds is answered. */
  claimStorageId(): Promise<string>;
  /**
   * A URL a node may GET the blob from for `seconds`, naming `fileName` for a download; null where the store
   * cannot hand one out (file).
   */
  presign(sha256: string, o: { seconds: number; fileName?: string }): Promise<string | null>;
  close(): void;
}

/** HANGAR_MIRROR_STORE's value is not one Hangar knows: the message says what is accepted. */
export class MirrorStoreConfigError extends Error {
  override name = 'MirrorStoreConfigError';
}

export type StoreSpec = { kind: 'file' } | { kind: 's3'; bucket: string; prefix: string };

/** `file`, or `s3://bucket` with an optional `/prefix`. */
export function parseStoreSpec(value: string | undefined): StoreSpec {
  const v = (value ?? '').trim();
  if (v === '' || v === 'file') return { kind: 'file' };
  const m = /^s3:\/\/([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:\/(.*))?$/.exec(v);
  if (!m)
    throw new MirrorStoreConfigError(
      `HANGAR_MIRROR_STORE=${JSON.stringify(v.slice(0, 200))} is not a store: use 'file' (the data dir, the default) or 's3://bucket/prefix' (an S3-compatible bucket; credentials, region and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL or AWS_PROFILE)`,
    );
  const prefix = (m[2] ?? '').replace(/^\/+|\/+$/g, '');
  return { kind: 's3', bucket: m[1] as string, prefix: prefix ? `${prefix}/` : '' };
}

/** The key (or path part) a blob is kept under: its sha256, fanned out so no listing holds millions of names. */
export function blobKey(sha256: string): string {
  if (!/^[0-9a-f]{64}$/.test(sha256)) throw new Error(`not a sha256: ${JSON.stringify(sha256.slice(0, 80))}`);
  return `blobs/sha256/${sha256.slice(0, 2)}/${sha256}`;
}

/**
 * The store HANGAR_MIRROR_STORE names. The S3 client is loaded only when a bucket is named: a `file` mirror
 * never pays for the AWS SDK at start (test/build.test.ts).
 */
export async function openMirrorStore(o: {
  spec: StoreSpec;
  /** The mirror's root under the data dir (MirrorPaths.root): a file store's home. */
  root: string;
  db: Db;
  /** HANGAR_S3_FORCE_PATH_STYLE: bucket names in the path, as MinIO and Ceph RGW are often set up. */
  forcePathStyle?: boolean;
  /** Bytes per multipart part (S3's minimum is 5 MiB but for the last). */
  partBytes?: number;
}): Promise<MirrorStore> {
  if (o.spec.kind === 'file') {
    const { FileStore } = await import('./file-store.js');
    return new FileStore({ root: o.root });
  }
  const { S3Store, loadS3Sdk } = await import('./s3-store.js');
  await loadS3Sdk();
  return new S3Store({
    bucket: o.spec.bucket,
    prefix: o.spec.prefix,
    db: o.db,
    forcePathStyle: o.forcePathStyle ?? false,
    partBytes: o.partBytes,
  });
}

/**
 * The write's calls one after another, in the order they were made: http-get.ts hands a body's next block over
 * before the last one's promise settles, and a block hashed or sent ahead of the one before it makes another
 * file (a 64 MiB fetch into a bucket once came out with the right size and a wrong sha256).
 */
export function inOrder(w: BlobWrite): BlobWrite {
  let last: Promise<unknown> = Promise.resolve();
  const next = <T>(fn: () => Promise<T>): Promise<T> => {
    const run = last.then(fn);
    last = run.catch(() => {});
    return run;
  };
  return {
    get offset() {
      return w.offset;
    },
    write: (chunk) => next(() => w.write(chunk)),
    finish: () => next(() => w.finish()),
    close: () => next(() => w.close()),
    discard: () => next(() => w.discard()),
  };
}
