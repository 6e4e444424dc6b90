import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';

// Which storage the mirror's bytes are on. Replicas that share a database must share the mirror's storage; a
// replica started on other storage (another HANGAR_DATA_DIR, or a mount that is not there yet) would otherwise
// find none of the files the database lists and fail them all as "removed by hand". The id is written once into
// the mirror's root, so it travels with the storage, and each file row records the id it was written on.

/** The mirror cannot start on this storage: the message says why and what to do. Nothing was changed. */
export class MirrorStorageError extends Error {
  override name = 'MirrorStorageError';
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;

/** The id in `file`, or null when there is none. */
export async function readStorageId(file: string): Promise<string | null> {
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new MirrorStorageError(
      `${file} cannot be read (${(err as Error).message}): the mirror's storage id is kept there`,
    );
  }
  const id = text.trim();
  if (!ID.test(id))
    throw new MirrorStorageError(
      `${file} holds ${JSON.stringify(id.slice(0, 100))}, which is not a storage id: one line of letters, digits, '.', '_' and '-' (up to 100), as Hangar wrote it`,
    );
  return id;
}

/**
 * Writes a new id into `file`, unless another replica on the same storage wrote one first (then that one is
 * answered). A link from a complete temporary file, so a replica starting at the same moment never reads half an id.
 */
export async function createStorageId(file: string): Promise<string> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const id = randomUUID();
  const tmp = `${file}.${process.pid}.${id.slice(0, 8)}.tmp`;
  const fh = await fs.open(tmp, 'w');
  try {
    await fh.writeFile(`${id}\n`);
    await fh.datasync();
  } finally {
    await fh.close();
  }
  try {
    await fs.link(tmp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    return (await readStorageId(file)) as string;
  } finally {
    await fs.rm(tmp, { force: true });
  }
  return id;
}

/** Whether `dir` exists and holds anything. */
export async function holdsAnything(dir: string): Promise<boolean> {
  try {
    return (await fs.readdir(dir)).length > 0;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}
