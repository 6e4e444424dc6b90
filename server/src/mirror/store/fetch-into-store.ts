import type { DownloadSink } from '@hangar/common/download/sink';
import type { OutboundGuard } from '@hangar/common/outbound';
import { type RetryState, transfer } from '../transfer.js';
import type { BlobWrite, MirrorStore } from './store.js';

// A file from an upstream into a store's resumable write (store.ts), verified against its sha256. The loop is the
// disk fetch's own (transfer.ts over download/resumable.ts) with the write as its sink, so every rule holds here
// too: Range from the write's offset (on S3, after a restart, the last part sent), If-Range with the ETag of the
// earlier attempt, Retry-After, the give-up-after timer for an upstream out of reach, no HTML page or empty body
// taken for the file, the stall timer, the bandwidth limit, and the early "already held" once the upstream
// publishes the sha256. The bytes are held to the sha256 asked for, else to the one the upstream publishes (the
// Hub's X-Linked-Etag), by Hangar's own hash, never the store's ETag.

export type StoreFetchResult =
  | {
      ok: true;
      sha256: string;
      size: number;
      /** The store had these bytes already under their sha256: they were not kept twice. */
      held: boolean;
      /** Nothing was fetched: alreadyHeld said the mirror holds what the upstream published. */
      linked: boolean;
      resumedFrom: number;
      /** The upstream's ETag, for the next attempt's If-Range. */
      etag: string | null;
      upstreamSha256: string | null;
    }
  | { ok: false; reason: string };

export type StoreFetchOptions = {
  store: MirrorStore;
  /** The write's id (the MirrorFile's): a later call with the same id resumes. */
  id: string;
  url: string;
  expectedSha256?: string | null;
  expectedSize?: number | null;
  /** The ETag an earlier attempt saw (persisted with the row): sent as If-Range when resuming. */
  etag?: string | null;
  headers?: Record<string, string>;
  guard?: OutboundGuard;
  /** Failed tries in a row that brought no byte (an unreachable upstream aside) before giving up. */
  maxAttempts?: number;
  /** How long the upstream may stay out of reach before giving up (HANGAR_MIRROR_GIVE_UP_AFTER); 6 h unless set. */
  giveUpAfterMs?: number;
  /** The backoff's cap between tries (HANGAR_MIRROR_RETRY_MAX); a Retry-After may ask for longer. */
  retryMaxMs?: number;
  backoffMs?: (attempt: number) => number;
  signal?: AbortSignal;
  onProgress?: (bytesDone: number, bytesTotal: number | null, etag: string | null) => void;
  /** Told when the fetch waits to try again, and with null once bytes move again. */
  onRetry?: (retry: RetryState | null) => void;
  /**
   * Without a byte for this long, an attempt fails and is tried again with a Range (HANGAR_MIRROR_STALL_SECONDS):
   * a silent upstream must not hold the worker, nor its lease, until someone cancels. Absent: no timer.
   */
  stallMs?: number;
  /** The mirror's bandwidth limit (bandwidth.ts, HANGAR_MIRROR_BANDWIDTH): every byte written is taken from it. */
  throttle?: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
  /** Asked once the upstream publishes the sha256, before a byte is taken: true when the mirror holds it already. */
  alreadyHeld?: (sha256: string, size: number | null) => Promise<boolean>;
  /**
   * Deletes a blob this fetch placed but that did not verify: the mirror's guarded removal (blob-claims.ts), so a
   * version landing the same bytes at that moment keeps them. The store's own remove unless given.
   */
  removeBlob?: (sha256: string) => Promise<void>;
  /**
   * Asked once the size is known, before a byte is taken: null when there is room, else why not (the mirror's
   * MirrorSpace: on a bucket, what HANGAR_S3_QUOTA leaves). Absent: no limit.
   */
  reserveSpace?: (bytes: number) => Promise<string | null>;
  log?: (msg: string, fields: Record<string, unknown>) => void;
};

export async function fetchIntoStore(o: StoreFetchOptions): Promise<StoreFetchResult> {
  let sink: ReturnType<typeof writeSink>;
  try {
    sink = writeSink(o.store, o.id, await o.store.openWrite(o.id), o.removeBlob, o.log);
  } catch (err) {
    return { ok: false, reason: `could not open the write in ${o.store.where}: ${(err as Error).message}` };
  }
  const resumedFrom = sink.offset;
  try {
    const r = await transfer({
      url: o.url,
      sink,
      expectedSize: o.expectedSize,
      etag: o.etag,
      headers: o.headers,
      guard: o.guard,
      stallMs: o.stallMs ?? Number.POSITIVE_INFINITY,
      maxAttempts: o.maxAttempts ?? 5,
      giveUpAfterMs: o.giveUpAfterMs,
      retryMaxMs: o.retryMaxMs,
      backoffMs: o.backoffMs,
      onRetry: o.onRetry,
      throttle: o.throttle,
      alreadyHeld: o.alreadyHeld,
      reserveSpace: o.reserveSpace,
      signal: o.signal ?? new AbortController().signal,
      onProgress: (p) => o.onProgress?.(p.bytesDone, p.bytesTotal, p.etag),
      log: o.log,
    });
    if (!r.ok) {
      // Cancelled (paused, shut down) or worth another try: what was checkpointed stays for the next call, which
      // the landing discards when the file was cancelled or removed. An answer that will not change: thrown away.
      if (r.reason === 'cancelled' || r.keepPartial) await sink.close();
      else await sink.drop();
      return { ok: false, reason: r.reason };
    }
    const common = { resumedFrom, etag: r.etag, upstreamSha256: r.upstreamSha256 };
    if (r.held) return { ok: true, sha256: r.sha256, size: r.size, held: true, linked: true, ...common };
    const wanted = o.expectedSha256 ?? r.upstreamSha256;
    if (wanted && r.sha256 !== wanted) {
      // Kept under its own sha256 by the write's finish: the bytes are not the file asked for, so they go again.
      await sink.drop();
      return {
        ok: false,
        reason: `sha256 mismatch: ${o.expectedSha256 ? 'expected' : 'the upstream published'} ${wanted}, the bytes hash to ${r.sha256}; the download was discarded`,
      };
    }
    return { ok: true, sha256: r.sha256, size: r.size, held: sink.held, linked: false, ...common };
  } catch (err) {
    // The write's own trouble (the bucket or the database out of reach while reopening it): kept for a retry.
    await sink.close().catch(() => {});
    return { ok: false, reason: (err as Error).message };
  }
}

/**
 * A store's write as the download loop's sink. A write that failed (a part S3 refused, a checkpoint the database
 * did not take) is reopened at its last checkpoint before the next try; one that finished has placed its blob,
 * so throwing it away deletes the blob, unless the store held those bytes before.
 */
function writeSink(
  store: MirrorStore,
  id: string,
  first: BlobWrite,
  removeBlob?: (sha256: string) => Promise<void>,
  log?: StoreFetchOptions['log'],
) {
  let write = first;
  let broken = false;
  let done: { sha256: string; size: number; held: boolean } | null = null;
  let closed = false;
  const forget = async () => {
    if (done) {
      if (!done.held) await (removeBlob ?? ((sha: string) => store.remove(sha)))(done.sha256);
      done = null;
    } else
      await write.discard().catch((err) =>
        // Its checkpoint is gone either way; parts a bucket would not abort are left to its lifecycle rule
        // (AbortIncompleteMultipartUpload), as s3-store.ts says. The fetch itself goes on.
        log?.('could not abort the multipart upload of a discarded write', { id, error: (err as Error).message }),
      );
    closed = true;
  };
  const sink: DownloadSink & { held: boolean; close(): Promise<void> } = {
    get offset() {
      return write.offset;
    },
    get held() {
      return done?.held ?? false;
    },
    async write(chunk) {
      try {
        await write.write(chunk);
      } catch (err) {
        broken = true;
        throw err;
      }
    },
    async recover() {
      if (!broken) return;
      broken = false;
      await write.close().catch(() => {});
      write = await store.openWrite(id);
    },
    async restart() {
      await forget();
      write = await store.openWrite(id);
      closed = false;
    },
    async finish() {
      try {
        done = await write.finish();
      } catch (err) {
        broken = true;
        throw err;
      }
      closed = true;
      return done;
    },
    drop: forget,
    async close() {
      if (closed) return;
      closed = true;
      await write.close();
    },
  };
  return sink;
}
