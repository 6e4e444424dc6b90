import { randomUUID } from 'node:crypto';
import { inOrder, type MirrorStore } from './store.js';

// Bytes Hangar already holds and has hashed (training's pairs, an adapter a node uploaded) into the store under
// their sha256, for every replica to read: written through the store's own write, so the sha256 is checked again
// as the bytes go in, and nothing is kept under a sha256 the bytes do not have.

/** Thrown when the bytes written are not the ones named: the caller's file changed underneath it. */
export class BlobMismatchError extends Error {
  override name = 'BlobMismatchError';
}

/**
 * Keeps `body` in the store as the blob `sha256` (nothing is written when the store holds it already). The write
 * has an id of its own, so the same bytes kept twice at once are two writes that end in the one blob.
 */
export async function putBlob(
  store: MirrorStore,
  sha256: string,
  body: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
): Promise<void> {
  if (await store.stat(sha256)) return;
  const w = inOrder(await store.openWrite(`put-${randomUUID()}`));
  let done: Awaited<ReturnType<typeof w.finish>>;
  try {
    for await (const chunk of body) await w.write(chunk);
    done = await w.finish();
  } catch (err) {
    await w.discard().catch(() => {});
    throw err;
  }
  if (done.sha256 !== sha256) {
    if (!done.held) await store.remove(done.sha256);
    throw new BlobMismatchError(
      `the bytes kept as sha256 ${sha256} hash to ${done.sha256} (${done.size} bytes): they changed while being written; nothing was kept`,
    );
  }
}
