import type { ByteSource } from '@hangar/common/gguf/source';
import type { Db } from '../db/client.js';
import { blobHeldByTraining } from '../train/train-store.js';
import { removeUnclaimedBlob } from './blob-claims.js';
import { type FileWhat, readKindFrom } from './kind.js';
import { fetchIntoStore, type StoreFetchOptions } from './store/fetch-into-store.js';
import type { MirrorStore } from './store/store.js';
import type { TransferDone, TransferFailed } from './transfer.js';

// The mirror's side of a bucket (HANGAR_MIRROR_STORE=s3://…): what the workers, the landing, removal and the
// start-up check do instead of touching files under the data dir. Each is called only where MirrorStorage.bucket
// is set, beside the unchanged `file` code: a `file` mirror never reaches this module.

/**
 * One file from its URL into the bucket, by the store's resumable fetch (store/fetch-into-store.ts: the disk
 * fetch's loop and rules, with the bucket's write as its sink): its multipart state is checkpointed under the row's
 * id, so a restart or another replica continues from the last part. Verified against the row's sha256, else the
 * one the upstream publishes, before it is answered.
 */
export async function fetchToBucket(o: StoreFetchOptions): Promise<TransferDone | TransferFailed> {
  const r = await fetchIntoStore(o);
  if (!r.ok) return { ok: false, reason: r.reason, keepPartial: false };
  const { size, sha256, upstreamSha256, etag } = r;
  // `linked`: nothing fetched, the mirror held the bytes (the landing's `held`, checked again as it lands). The
  // store's own `held` (the bucket had these bytes under their sha256) needs nothing: the row simply names them.
  return r.linked
    ? { ok: true, size, sha256, upstreamSha256, etag, held: true }
    : { ok: true, size, sha256, upstreamSha256, etag };
}

/**
 * Throws away a cancelled or removed file's multipart upload and its checkpoint, when it has one: opening a write
 * to discard it would start a new upload for nothing.
 */
export async function discardBucketWrite(db: Db, store: MirrorStore, id: string) {
  if (!(await db.mirrorUpload.findUnique({ where: { id }, select: { id: true } }))) return;
  const w = await store.openWrite(id);
  await w.discard();
}

/** What a blob in the bucket holds, from its header read by range (kind.ts), as a file on disk would be read. */
export function readBlobKind(store: MirrorStore, sha256: string, size: number, file: string): Promise<FileWhat> {
  return readKindFrom(async () => blobSource(store, sha256, size), file);
}

/**
 * A blob's bytes read by offset, each read one Range request: what reading a GGUF's header needs (kind.ts, the
 * catalog's plan), without fetching the whole file (weights are gigabytes, a header a few megabytes at most).
 */
export function blobSource(store: MirrorStore, sha256: string, size: number): ByteSource {
  const src: ByteSource = {
    size,
    bytesRead: 0,
    async read(offset, length) {
      const end = Math.min(size, offset + length) - 1;
      if (end < offset) return Buffer.alloc(0);
      const chunks: Buffer[] = [];
      for await (const c of await store.read(sha256, { start: offset, end })) chunks.push(Buffer.from(c));
      const buf = Buffer.concat(chunks);
      src.bytesRead += buf.length;
      return buf;
    },
    close: async () => {},
  };
  return src;
}

/**
 * Deletes the blobs of removed files that no remaining row names: content-addressed, one object may serve many
 * versions, and it goes only with the last of them. Decided and deleted under each sha256's lock
 * (blob-claims.ts), so a file landing the same bytes at that moment either keeps the blob or is fetched again.
 */
export async function removeUnheldBlobs(db: Db, store: MirrorStore, sha256s: readonly (string | null)[]) {
  const removed: string[] = [];
  for (const sha of new Set(sha256s.filter((s): s is string => Boolean(s)))) {
    // Training keeps its pairs and artifacts in the same bucket by sha256 (train/train-files.ts): a published
    // adapter's bytes are also its job's artifact, and stay while the job does.
    if (await blobHeldByTraining(db, sha)) continue;
    if (await removeUnclaimedBlob(db, store, sha)) removed.push(sha);
  }
  return removed;
}
