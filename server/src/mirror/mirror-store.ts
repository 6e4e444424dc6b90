import type { Db, Tx } from '../db/client.js';

// Mirrored files belong to the mirror (db/owners.ts). Other domains read their rows only through these functions,
// so test/table-owners.test.ts can hold every other folder to that and a change to their columns is made here once.

type Client = Db | Tx;

/** One mirrored file's row by model, version and path, whatever its state (check `state` for PRESENT). */
export function mirrorFileRow(db: Client, model: string, version: string, file: string) {
  return db.mirrorFile.findUnique({ where: { model_version_file: { model, version, file } } });
}

/** Every present file fetched from a Hub repository (`owner/name`), newest first: the versions that mirror it. */
export function presentFilesOfRepo(db: Client, repo: string) {
  return db.mirrorFile.findMany({
    where: { state: 'PRESENT', sourceUrl: { contains: `/${repo}/resolve/` } },
    orderBy: { finishedAt: 'desc' },
  });
}
