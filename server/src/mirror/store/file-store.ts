import { createReadStream } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { Sha256 } from '@hangar/common/download/sha256';
import { createStorageId, readStorageId } from '../storage.js';
import { type BlobWrite, blobKey, inOrder, type MirrorStore, type StoreUsage } from './store.js';

// The mirror's bytes in a directory under the data dir, as they always were: a write appends to a partial file
// named by its id, and a restart picks it up by hashing what it holds again (the file is its own checkpoint); a
// whole, hashed blob is renamed into place, atomically on one filesystem. Free space is the disk's.

export class FileStore implements MirrorStore {
  readonly kind = 'file' as const;
  readonly where: string;
  private readonly root: string;

  constructor(o: { root: string }) {
    this.root = o.root;
    this.where = o.root;
  }

  private blob(sha256: string) {
    return path.join(this.root, ...blobKey(sha256).split('/'));
  }

  private partial(id: string) {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/.test(id)) throw new Error(`not a write id: ${JSON.stringify(id)}`);
    return path.join(this.root, 'partial', `${id}.blob-part`);
  }

  async openWrite(id: string): Promise<BlobWrite> {
    const partial = this.partial(id);
    await fs.mkdir(path.dirname(partial), { recursive: true });
    const hash = new Sha256();
    // After a restart the hash state is gone: re-reading the partial picks it up exactly where the bytes stop.
    let offset = await hash.addFile(partial);
    const fh = await fs.open(partial, 'a');
    let open = true;
    const end = async () => {
      if (!open) return;
      open = false;
      await fh.close().catch(() => {});
      await hash.close().catch(() => {});
    };
    return inOrder({
      get offset() {
        return offset;
      },
      write: async (chunk) => {
        await fh.write(chunk);
        await hash.update(chunk);
        offset += chunk.length;
      },
      finish: async () => {
        await fh.datasync();
        const sha256 = await hash.digest();
        await end();
        const target = this.blob(sha256);
        const held = await this.stat(sha256);
        if (held) await fs.rm(partial, { force: true });
        else {
          await fs.mkdir(path.dirname(target), { recursive: true });
          await fs.rename(partial, target);
        }
        return { sha256, size: offset, held: held !== null };
      },
      close: end,
      discard: async () => {
        await end();
        await fs.rm(partial, { force: true });
      },
    });
  }

  async stat(sha256: string) {
    const st = await fs.stat(this.blob(sha256)).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return null;
      throw err;
    });
    return st ? { size: st.size } : null;
  }

  async read(sha256: string, range?: { start: number; end: number }): Promise<Readable> {
    const file = this.blob(sha256);
    await fs.access(file); // a missing blob fails here, not as a stream error half-way into an answer
    return createReadStream(file, range ? { start: range.start, end: range.end } : {});
  }

  async remove(sha256: string) {
    await fs.rm(this.blob(sha256), { force: true });
  }

  async usage(): Promise<StoreUsage> {
    let usedBytes = 0;
    const dir = path.join(this.root, 'blobs');
    const files = await fs.readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
    for (const f of files)
      if (f.isFile()) usedBytes += (await fs.stat(path.join(f.parentPath, f.name)).catch(() => ({ size: 0 }))).size;
    await fs.mkdir(this.root, { recursive: true });
    const st = await fs.statfs(this.root);
    return { usedBytes, freeBytes: st.bavail * st.bsize };
  }

  // The same file as the mirror has always kept its id in (MirrorPaths.storageIdFile).
  storageId() {
    return readStorageId(path.join(this.root, '.hangar-storage-id'));
  }

  claimStorageId() {
    return createStorageId(path.join(this.root, '.hangar-storage-id'));
  }

  async presign() {
    return null;
  }

  close() {}
}
