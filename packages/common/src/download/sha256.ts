import { Worker } from 'node:worker_threads';

// A running sha256 computed on a thread of its own. On the event loop, hashing a download took as long as
// receiving and writing it together, and held a fetch to 1.2 GB/s at best; here the loop only receives, the
// disk thread writes and this thread hashes, all at once (bench/mirror.ts). One thread serves every stream in
// the process, in the order each stream's calls were made.

type Pending = { resolve: (v: unknown) => void; reject: (e: Error) => void };

let worker: Worker | null = null;
const pending = new Map<number, Pending>();
let seq = 0;
let nextId = 0;

function thread(): Worker {
  if (worker) return worker;
  const w = new Worker(new URL('./sha256-worker.cjs', import.meta.url));
  w.on('message', (m: { seq: number; value?: unknown; error?: string }) => {
    const p = pending.get(m.seq);
    pending.delete(m.seq);
    if (pending.size === 0) w.unref(); // idle: it must not keep the process alive
    if (m.error === undefined) p?.resolve(m.value);
    else p?.reject(new Error(m.error));
  });
  const lost = (why: Error) => {
    if (worker === w) worker = null;
    for (const p of pending.values()) p.reject(why);
    pending.clear();
  };
  w.on('error', lost);
  w.on('exit', (code) => lost(new Error(`the hashing thread exited (code ${code})`)));
  worker = w;
  return w;
}

function call<T>(message: Record<string, unknown>): Promise<T> {
  const w = thread();
  const n = seq++;
  w.ref();
  return new Promise<T>((resolve, reject) => {
    pending.set(n, { resolve: resolve as (v: unknown) => void, reject });
    w.postMessage({ ...message, seq: n });
  });
}

export class Sha256 {
  private readonly id = nextId++;

  constructor() {
    call({ op: 'open', id: this.id }).catch(() => {}); // a lost thread fails the calls that follow
  }

  /** Starts again from no bytes. */
  reset(): Promise<void> {
    return call({ op: 'open', id: this.id });
  }

  /**
   * Adds a block. One in a SharedArrayBuffer is read in place, so it must stay unchanged until this resolves;
   * any other is copied first.
   */
  update(block: Uint8Array): Promise<void> {
    const shared =
      block.buffer instanceof SharedArrayBuffer ? block : new Uint8Array(new SharedArrayBuffer(block.length));
    if (shared !== block) shared.set(block);
    return call({
      op: 'update',
      id: this.id,
      buffer: shared.buffer,
      offset: shared.byteOffset,
      length: shared.length,
    });
  }

  /** Adds a file's bytes (a partial download picked up after a restart): its size, or 0 when it does not exist. */
  addFile(file: string): Promise<number> {
    return call({ op: 'file', id: this.id, file });
  }

  /** The hex digest of what was added so far; more can be added after. */
  digest(): Promise<string> {
    return call({ op: 'digest', id: this.id });
  }

  close(): Promise<void> {
    return call({ op: 'close', id: this.id });
  }
}

/** A whole file's sha256 and size, hashed on the hashing thread (0 bytes when there is no such file). */
export async function sha256File(file: string): Promise<{ sha256: string; size: number }> {
  const h = new Sha256();
  try {
    const size = await h.addFile(file);
    return { sha256: await h.digest(), size };
  } finally {
    await h.close().catch(() => {});
  }
}
