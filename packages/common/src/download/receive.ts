import type { FileHandle } from 'node:fs/promises';
import type { GetResponse } from './http-get.js';
import type { Sha256 } from './sha256.js';

// What every download in Hangar does with a body (the mirror's fetches, a node's model cache, a training job's
// data and base weights): three things at once. The socket fills the next buffers (httpGet), the disk writes
// the blocks one after another in order, and the hashing thread takes each block once it is written. Written
// one chunk at a time instead, awaiting each write and hashing on the event loop, a fetch ran at 0.26× `curl -o`.

/** Written bytes between flushes to the disk while a file arrives, when it is to be flushed at all. */
const SYNC_EVERY = 256 << 20;

export type ReceiveOptions = {
  /** Told the bytes handed over so far before each block is written; throws to refuse the block (too long). */
  check?: (handed: number) => void;
  /** Told of every read as it lands: a stall watch. */
  onBytes?: (n: number) => void;
  /** After each block is on disk and in the hash. */
  onWritten?: (offset: number) => void;
  /** Flush to the disk as it goes and at the end, before this resolves. */
  fsync?: boolean;
  /**
   * A bandwidth limit (the mirror's): when it answers a slice size, each block is written in slices of that
   * size, each after `take` lets it go, so progress moves (and the stall watch hears) at the limited pace.
   */
  throttle?: { slice(): number | null; take(bytes: number): Promise<void> };
};

/**
 * Appends a response's body to an open file and to a running sha256. `at.offset` moves only with bytes that are
 * both on disk and in the hash, so after any error it says exactly what the file holds and a resume can go on
 * from there; a failed write fails every write after it, so nothing lands past a gap.
 */
export async function receiveInto(
  res: GetResponse,
  file: FileHandle,
  hash: Sha256,
  at: { offset: number },
  o: ReceiveOptions = {},
): Promise<void> {
  let writes = Promise.resolve();
  let handed = at.offset;
  let unsynced = 0;
  let syncing: Promise<unknown> = Promise.resolve();
  // The last block's promise, hashed and counted: a sliced block starts after it, so the offset only ever grows.
  let last: Promise<void> = Promise.resolve();
  await res.readBody((block) => {
    handed += block.length;
    o.check?.(handed);
    const slice = o.throttle?.slice() ?? null;
    if (slice !== null && o.throttle) {
      const { take } = o.throttle;
      const sliced = Promise.all([writes, last]).then(async () => {
        for (let from = 0; from < block.length; from += slice) {
          const piece = block.subarray(from, Math.min(block.length, from + slice));
          await take(piece.length);
          await writeAll(file, piece);
          await hash.update(piece);
          at.offset += piece.length;
          o.onWritten?.(at.offset);
        }
      });
      writes = sliced;
      last = sliced;
      return sliced;
    }
    const written = writes.then(() => writeAll(file, block));
    writes = written;
    last = written
      .then(() => hash.update(block))
      .then(() => {
        at.offset += block.length;
        o.onWritten?.(at.offset);
        unsynced += block.length;
        if (o.fsync && unsynced >= SYNC_EVERY) {
          // Alongside the writes, so the flush at the end has little left. A real failure shows in that one.
          unsynced = 0;
          syncing = file.datasync().catch(() => {});
        }
      });
    return last;
  }, o.onBytes);
  if (o.fsync) {
    await syncing;
    await file.datasync();
  }
}

/** A write to a file can take fewer bytes than it was given (a disk filling up): the rest goes in again. */
async function writeAll(file: FileHandle, block: Buffer) {
  for (let done = 0; done < block.length; ) {
    const { bytesWritten } = await file.write(block, done, block.length - done);
    done += bytesWritten;
  }
}

/**
 * Aborts `stall` with `why` once no byte has been heard of for `ms`. It looks a few times per `ms` instead of
 * re-arming a timer at every read, which alone cost a third of a fast fetch's throughput.
 */
export function watchStall(ms: number, stall: AbortController, why: () => Error) {
  let heard = 0;
  let seen = 0;
  let quietSince = Date.now();
  const timer = setInterval(
    () => {
      if (heard !== seen) {
        seen = heard;
        quietSince = Date.now();
      } else if (Date.now() - quietSince >= ms) {
        stall.abort(why());
      }
    },
    Math.max(10, Math.min(1000, ms / 4)),
  );
  return {
    heard: (n: number) => {
      heard += n;
    },
    stop: () => clearInterval(timer),
  };
}

/** The start of a body as text (an error page's reason), then the connection dropped. */
export async function bodyText(res: GetResponse, limit = 4096): Promise<string> {
  const parts: Buffer[] = [];
  let size = 0;
  try {
    await res.readBody(async (block) => {
      if (size < limit) parts.push(Buffer.from(block.subarray(0, limit - size)));
      size += block.length;
      if (size >= limit) throw new Error('enough');
    });
  } catch {
    // a cut or the limit: what arrived is enough to say why
  }
  res.cancel();
  return Buffer.concat(parts).toString('utf8');
}
