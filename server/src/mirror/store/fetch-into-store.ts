import { httpGet } from '@hangar/common/download/http-get';
import { watchStall } from '@hangar/common/download/receive';
import { upstreamDigest } from '@hangar/common/download/resumable';
import type { OutboundGuard } from '@hangar/common/outbound';
import { backoffMs, sleep } from '@hangar/common/retry';
import type { BlobWrite, MirrorStore } from './store.js';

// A file from an upstream into a store's resumable write (store.ts), verified against its sha256: a dropped
// connection is resumed with a Range from the write's offset, and a restart continues from the write's last
// checkpoint (on S3, the last part sent). An upstream that ignores the Range starts over once from zero. The
// bytes are held to the sha256 asked for, else to the one the upstream publishes (the Hub's X-Linked-Etag), by
// Hangar's own hash, never the store's ETag.

export type StoreFetchResult =
  | { ok: true; sha256: string; size: number; held: boolean; resumedFrom: number }
  | { ok: false; reason: string };

export async function fetchIntoStore(o: {
  store: MirrorStore;
  /** The write's id (the MirrorFile's): a later call with the same id resumes. */
  id: string;
  url: string;
  expectedSha256?: string | null;
  headers?: Record<string, string>;
  guard?: OutboundGuard;
  /** Failed tries in a row that brought no byte before giving up. */
  maxAttempts?: number;
  signal?: AbortSignal;
  onProgress?: (bytesDone: number, bytesTotal: number | null) => void;
  /**
   * Without a byte for this long, an attempt fails and is tried again with a Range (HANGAR_MIRROR_STALL_SECONDS):
   * a silent upstream must not hold the worker, nor its lease, until someone cancels. Absent: no timer.
   */
  stallMs?: number;
  /** The mirror's bandwidth limit (bandwidth.ts, HANGAR_MIRROR_BANDWIDTH): every byte written is taken from it. */
  throttle?: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
}): Promise<StoreFetchResult> {
  const signal = o.signal ?? new AbortController().signal;
  let write: BlobWrite = await o.store.openWrite(o.id);
  const resumedFrom = write.offset;
  let startedOver = false;
  let misses = 0;
  let last = 'no attempt was made';
  let published: string | null = null;
  const startOver = async (why: string) => {
    if (startedOver) throw new Error(`${why} again after starting over once: giving up rather than looping`);
    startedOver = true;
    await write.discard();
    write = await o.store.openWrite(o.id);
  };
  const verified = async (done: { sha256: string; size: number; held: boolean }): Promise<StoreFetchResult> => {
    const wanted = o.expectedSha256 ?? published;
    if (wanted && done.sha256 !== wanted) {
      // Kept under its own sha256 by finish(): the bytes are not the file asked for, so they go again.
      if (!done.held) await o.store.remove(done.sha256);
      return {
        ok: false,
        reason: `sha256 mismatch: ${o.expectedSha256 ? 'expected' : 'the upstream published'} ${wanted}, the bytes hash to ${done.sha256}; the download was discarded`,
      };
    }
    return { ok: true, ...done, resumedFrom };
  };
  try {
    for (;;) {
      if (signal.aborted) {
        await write.close();
        return { ok: false, reason: 'cancelled' };
      }
      const before = write.offset;
      // The same timer as the disk's download (download/receive.ts): it is told of every byte as it lands.
      const stall = new AbortController();
      const stallMs = o.stallMs;
      const watch = stallMs
        ? watchStall(stallMs, stall, () => new Error(`stalled: no bytes for ${stallMs / 1000} s`))
        : null;
      let res: Awaited<ReturnType<typeof httpGet>> | undefined;
      try {
        const headers: Record<string, string> = { ...o.headers, 'accept-encoding': 'identity' };
        if (before > 0) headers.range = `bytes=${before}-`;
        res = await httpGet(o.url, { headers, signal: AbortSignal.any([signal, stall.signal]), guard: o.guard });
        // Asked for the bytes after the end: the write holds the whole file already (a crash after the last part).
        const whole = res.headers.get('content-range')?.match(/^bytes \*\/(\d+)$/)?.[1];
        if (res.status === 416 && before > 0 && Number(whole) === before) {
          res.cancel();
          return await verified(await write.finish());
        }
        if (res.status !== 200 && res.status !== 206) {
          res.cancel();
          const reason = `the upstream answered HTTP ${res.status}`;
          if (res.status === 429 || res.status >= 500) throw new Error(reason);
          await write.discard();
          return { ok: false, reason };
        }
        published = upstreamDigest(res.headers) ?? published;
        let total: number | null = null;
        if (res.status === 206) {
          const m = res.headers.get('content-range')?.match(/^bytes (\d+)-(\d+)\/(\d+|\*)$/);
          if (!m || Number(m[1]) !== before) {
            res.cancel();
            await startOver(`the upstream answered a different range (${res.headers.get('content-range') ?? 'none'})`);
            continue;
          }
          total = m[3] === '*' ? null : Number(m[3]);
        } else {
          if (before > 0) {
            res.cancel();
            await startOver('the upstream ignored the byte range (HTTP 200)');
            continue;
          }
          const length = res.headers.get('content-length');
          total = length === null ? null : Number(length);
        }
        const throttle = o.throttle;
        const slice = throttle?.slice() ?? null;
        // readBody hands the next block before the last one's promise settles: sliced blocks go one after another.
        let sliced = Promise.resolve();
        await res.readBody(async (block) => {
          if (!throttle || slice === null) {
            await write.write(block);
            o.onProgress?.(write.offset, total);
            return;
          }
          // In slices taken from the limit before each is written, as the disk's download does (receive.ts).
          sliced = sliced.then(async () => {
            for (let from = 0; from < block.length; from += slice) {
              const piece = block.subarray(from, Math.min(block.length, from + slice));
              await throttle.take(piece.length, signal);
              watch?.heard(piece.length); // waiting on the limit is not a stalled upstream
              await write.write(piece);
              o.onProgress?.(write.offset, total);
            }
          });
          await sliced;
        }, watch?.heard);
        if (total !== null && write.offset < total)
          throw new Error(`the connection ended at ${write.offset} of ${total} bytes`);
        return await verified(await write.finish());
      } catch (caught) {
        if (stall.signal.aborted) res?.cancel(); // a body left half-read would hold its socket open
        if (signal.aborted) continue;
        const err = stall.signal.aborted ? stall.signal.reason : caught;
        last = (err as Error).message;
        if (write.offset > before) misses = 0;
        else misses++;
        if (misses >= (o.maxAttempts ?? 5)) {
          await write.close();
          return { ok: false, reason: `gave up after ${misses} attempts; the last: ${last}` };
        }
        await sleep(backoffMs(misses, { baseMs: 200, maxMs: 5_000 }), signal).catch(() => {});
      } finally {
        watch?.stop();
      }
    }
  } catch (err) {
    await write.close().catch(() => {});
    return { ok: false, reason: (err as Error).message };
  }
}
