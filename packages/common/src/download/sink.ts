import type { GetResponse } from './http-get.js';
import type { ReceiveOptions } from './receive.js';

// Where a download's bytes go when they do not go to a partial file: the caller's own resumable write (the
// mirror's bucket, a multipart upload checkpointed in PostgreSQL). The download loop (resumable.ts) is the same
// either way, so every rule it holds (Range and If-Range, Retry-After, the give-up-after timer, HTML pages, the
// stall timer, the bandwidth limit, the early "already held") holds for both, and cannot drift apart again.

export interface DownloadSink {
  /** Bytes the sink holds: where the next byte goes, and where a resumed request's Range begins. */
  readonly offset: number;
  /** Takes the next bytes, after those before them; the sink hashes them as they come. */
  write(chunk: Uint8Array): Promise<void>;
  /**
   * After a try broke off: makes the sink fit to go on (a write that failed is reopened at its last checkpoint).
   * `offset` then says where the next try begins.
   */
  recover(): Promise<void>;
  /** Throws away everything held, a finished file included: the next byte written is the file's first. */
  restart(): Promise<void>;
  /** The bytes are whole: their sha256, hashed as they were written, and their size. */
  finish(): Promise<{ sha256: string; size: number }>;
  /**
   * Nothing of this write is kept, a finished file included: the caller holds these bytes already (beforeBody),
   * or they did not verify.
   */
  drop(): Promise<void>;
}

/**
 * Hands a response's body to a sink, block after block, in the bandwidth limit's slices when it has one (as
 * receiveInto does for a file). `at.offset` moves only with bytes the sink took, so after an error it says what
 * the sink holds.
 */
export async function receiveIntoSink(
  res: GetResponse,
  sink: DownloadSink,
  at: { offset: number },
  o: ReceiveOptions = {},
): Promise<void> {
  let handed = at.offset;
  // http-get.ts hands the next block over before the last one's promise settles: blocks go one after another.
  let last: Promise<void> = Promise.resolve();
  const put = async (piece: Uint8Array) => {
    await sink.write(piece);
    at.offset = sink.offset;
    o.onWritten?.(at.offset);
  };
  await res.readBody((block) => {
    handed += block.length;
    o.check?.(handed);
    const slice = o.throttle?.slice() ?? null;
    const throttle = o.throttle;
    last = last.then(async () => {
      if (slice === null || !throttle) return put(block);
      for (let from = 0; from < block.length; from += slice) {
        const piece = block.subarray(from, Math.min(block.length, from + slice));
        await throttle.take(piece.length);
        await put(piece);
      }
    });
    return last;
  }, o.onBytes);
  await last;
}
