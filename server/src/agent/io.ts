import { createHash, type Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';

// Small pieces both of the agent's downloaders use (the model cache, and the training worker's data and base
// weights): one copy, so a fix to one reaches the other.

/** A file's sha256 so far, as a Hash that more bytes can be added to (a resumed download). */
export async function hashFile(file: string, signal?: AbortSignal): Promise<Hash> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20, signal })) h.update(chunk as Buffer);
  return h;
}

/** Aborts when any of the given signals does; the undefined ones are left out. */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  return AbortSignal.any(signals.filter((s): s is AbortSignal => Boolean(s)));
}

/** Waits `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal) {
  return new Promise<void>((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}
