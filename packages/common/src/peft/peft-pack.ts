import { once } from 'node:events';
import { constants as fsConstants } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { pipeline as pipelineCallback, Readable } from 'node:stream';
import zlib from 'node:zlib';
import tar from 'tar-stream';

// The node agent's side of the PEFT adapter upload: the trainer's output directory packed as the gzipped tar
// that peft-tar.ts reads on the server. It packs only what that reader would accept the shape of (regular
// files at the top level), and never follows a link out of the directory.

/**
 * A gzipped tar of the regular files at the top level of dir, for the node agent to upload the trainer's output.
 * Subdirectories (a trainer's checkpoints and logs) are left out: the adapter is the top level. A symlink is an
 * error rather than followed, so a trainer cannot make the agent upload some other file on the node.
 * Errors (a symlink, a file changing size while read) arrive as the returned stream's 'error'.
 */
export function packDirectory(dir: string): Readable {
  const pack = tar.pack();
  fillPack(pack, dir).then(
    () => pack.finalize(),
    (err: Error) => pack.destroy(err),
  );
  // pipeline destroys every stream with the first error, so a failure while packing reaches the reader.
  return pipelineCallback(Readable.from(pack), zlib.createGzip(), () => {});
}

async function fillPack(pack: tar.Pack, dir: string) {
  const entries = await fs.readdir(dir, { withFileTypes: true });
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const d of entries) {
    const file = path.join(dir, d.name);
    if (d.isSymbolicLink())
      throw new Error(`${file} is a symlink: the adapter upload takes the directory's regular files only`);
    if (d.isDirectory()) continue;
    if (!d.isFile()) throw new Error(`${file} is not a regular file: the adapter upload takes regular files only`);
    // O_NOFOLLOW: a file swapped for a symlink after readdir is refused, not followed. O_NONBLOCK: one swapped
    // for a FIFO does not hang the agent on open.
    const flags = fsConstants.O_RDONLY | (fsConstants.O_NOFOLLOW ?? 0) | (fsConstants.O_NONBLOCK ?? 0);
    const handle = await fs.open(file, flags).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ELOOP') throw new Error(`${file} is a symlink: the adapter upload takes regular files only`);
      throw err;
    });
    try {
      const stat = await handle.stat();
      if (!stat.isFile()) throw new Error(`${file} is not a regular file: the adapter upload takes regular files only`);
      let finish!: (err?: Error | null) => void;
      const added = new Promise<void>((resolve, reject) => {
        finish = (err) => (err ? reject(err) : resolve());
      });
      const entry = pack.entry({ name: d.name, type: 'file', size: stat.size, mode: 0o644, mtime: stat.mtime }, finish);
      for await (const chunk of handle.createReadStream({ autoClose: false })) {
        if (!entry.write(chunk)) await once(entry, 'drain');
      }
      entry.end();
      await added;
    } finally {
      await handle.close();
    }
  }
}
