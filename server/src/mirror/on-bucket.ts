import type { ByteSource } from '@hangar/common/gguf/source';
import type { OutboundGuard } from '@hangar/common/outbound';
import type { Db } from '../db/client.js';
import { type FileWhat, readKindFrom } from './kind.js';
import { fetchIntoStore } from './store/fetch-into-store.js';
import type { MirrorStore } from './store/store.js';
import type { TransferDone, TransferFailed } from './transfer.js';

// The mirror's side of a bucket (HANGAR_MIRROR_STORE=s3://…): what the workers, the landing, removal and the
// start-up check do instead of touching files under the data dir. Each is called only where MirrorStorage.bucket
// is set, beside the unchanged `file` code: a `file` mirror never reaches this module.

/**
 * One file from its URL into the bucket, by the store's resumable fetch (store/fetch-into-store.ts): its
 * multipart state is checkpointed under the row's id, so a restart or another replica continues from the last
 * part. Verified against the row's sha256, else the one the upstream publishes, before it is answered.
 */
export async function fetchToBucket(o: {
  store: MirrorStore;
  id: string;
  url: string;
  expectedSha256: string | null;
  headers: Record<string, string>;
  guard: OutboundGuard;
  maxAttempts: number;
  signal: AbortSignal;
  onProgress: (bytesDone: number, bytesTotal: number | null) => void;
  /** HANGAR_MIRROR_STALL_SECONDS, in ms: a silent upstream fails the attempt, which is tried again. */
  stallMs: number;
  /** The mirror's bandwidth limit, shared with the downloads to disk (bandwidth.ts). */
  throttle: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
}): Promise<TransferDone | TransferFailed> {
  const r = await fetchIntoStore({
    store: o.store,
    id: o.id,
    url: o.url,
    expectedSha256: o.expectedSha256,
    headers: o.headers,
    guard: o.guard,
    maxAttempts: o.maxAttempts,
    signal: o.signal,
    onProgress: o.onProgress,
    stallMs: o.stallMs,
    throttle: o.throttle,
  });
  if (!r.ok) return { ok: false, reason: r.reason, keepPartial: false };
  // Already verified; `held` here means the bucket had these bytes under their sha256: nothing to link, the
  // row simply names them (the landing's `held` is about linking a file on disk).
  return { ok: true, size: r.size, sha256: r.sha256, upstreamSha256: null, etag: null };
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
 * versions, and it goes only with the last of them. Not yet guarded: a file landing the same bytes at the very
 * moment of the removal (its row not yet naming the sha256) can lose its blob; the serve then says it is missing.
 */
export async function removeUnheldBlobs(db: Db, store: MirrorStore, sha256s: readonly (string | null)[]) {
  const removed: string[] = [];
  for (const sha of new Set(sha256s.filter((s): s is string => Boolean(s)))) {
    const still = await db.mirrorFile.count({ where: { actualSha256: sha } });
    if (still) continue;
    await store.remove(sha);
    removed.push(sha);
  }
  return removed;
}
