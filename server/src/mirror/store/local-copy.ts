import { createHash, randomUUID } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { MirrorStore } from './store.js';

// Verified local copies of blobs kept in a bucket, for what can only read a file: llama.cpp's tokenizer (it opens
// a path), the PEFT tar read twice while publishing. Each copy is <dataDir>/cache/sha256/<hex>: written to a
// temporary file with its sha256 computed as the bytes arrive, and renamed into place only when it matches, so a
// file under its sha256 is always those bytes (a crash leaves a .part, never a wrong copy). Callers asking for the
// same blob at once share one fetch. Copies are this replica's own: any replica makes its own from the bucket.
// There is no size cap yet: a copy stays until its blob is forgotten (forget()) or the data dir is cleaned.

export class LocalCopyError extends Error {
  override name = 'LocalCopyError';
}

export class LocalCopies {
  private readonly store: MirrorStore;
  private readonly dir: string;
  private readonly fetching = new Map<string, Promise<string>>();

  constructor(o: { store: MirrorStore /** <dataDir>/cache/sha256 */; dir: string }) {
    this.store = o.store;
    this.dir = o.dir;
  }

  /** Where the copy of this blob is (or would be). */
  where(sha256: string): string {
    if (!/^[0-9a-f]{64}$/.test(sha256))
      throw new LocalCopyError(`not a sha256: ${JSON.stringify(sha256.slice(0, 80))}`);
    return path.join(this.dir, sha256);
  }

  /** The path of a verified local copy of the blob, fetched from the store first when this replica has none. */
  copy(sha256: string): Promise<string> {
    const file = this.where(sha256);
    let p = this.fetching.get(sha256);
    if (!p) {
      p = this.fetch(sha256, file).finally(() => this.fetching.delete(sha256));
      this.fetching.set(sha256, p);
    }
    return p;
  }

  /**
   * Takes in a file whose sha256 the caller computed while writing it (an upload just received): renamed into the
   * cache, so this replica reads it again without fetching it back from the bucket.
   */
  async adopt(sha256: string, file: string): Promise<string> {
    const into = this.where(sha256);
    await fs.mkdir(this.dir, { recursive: true });
    await fs.rename(file, into);
    return into;
  }

  /** Drops this replica's copy (its blob is gone or no longer needed here); nothing when there is none. */
  async forget(sha256: string) {
    await fs.rm(this.where(sha256), { force: true });
  }

  private async fetch(sha256: string, file: string): Promise<string> {
    if (
      await fs.stat(file).then(
        (s) => s.isFile(),
        () => false,
      )
    )
      return file;
    const held = await this.store.stat(sha256);
    if (!held)
      throw new LocalCopyError(
        `the blob sha256 ${sha256} is not in ${this.store.where}: it was removed from the bucket, or this replica is pointed at another bucket than the one that kept it (check HANGAR_MIRROR_STORE)`,
      );
    await fs.mkdir(this.dir, { recursive: true });
    const part = `${file}.${randomUUID()}.part`;
    const hash = createHash('sha256');
    let size = 0;
    try {
      await pipeline(
        await this.store.read(sha256),
        async function* (source: AsyncIterable<Buffer>) {
          for await (const chunk of source) {
            hash.update(chunk);
            size += chunk.length;
            yield chunk;
          }
        },
        createWriteStream(part),
      );
      const got = hash.digest('hex');
      if (got !== sha256 || size !== held.size)
        throw new LocalCopyError(
          `the copy of sha256 ${sha256} from ${this.store.where} came out as ${size} bytes hashing to ${got} (the bucket says ${held.size} bytes): the object was changed in the bucket by something other than Hangar; remove the version that lists it and fetch it again`,
        );
      await fs.rename(part, file);
      return file;
    } finally {
      await fs.rm(part, { force: true });
    }
  }
}
