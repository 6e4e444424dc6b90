import type { Db } from '../db/client.js';
import type { MirrorStore } from './store/store.js';

// A bucket keeps each sha256's bytes once, however many versions list them (content-addressed keys), so a blob
// goes only with the last row that names it. Two things must never interleave: a removal deciding that no row
// names a sha256 and deleting the blob, and a landing counting on that blob (a fetch whose bytes the bucket held
// already, or a file linked to a held copy) before its row names it. Without order, the removal could delete the
// object the landing had just counted on, and the file would be PRESENT with no bytes behind it. Both hold the
// sha256's advisory lock in PostgreSQL (every replica shares it): the landing claims (its row names the sha256)
// only while the blob is there, and the removal counts claims and deletes under the same lock. Whichever comes
// second sees what the first did: the removal keeps a claimed blob; the landing finds a deleted one gone and
// fetches the file again instead of naming missing bytes.
//
// On disk there is no shared object to lose (each version's file is its own hard link), but a landing that links
// the held copy of a version removed meanwhile finds nothing to link: with no bytes of its own it is fetched
// again too (mirror-landing.ts), rather than listed with an empty file.

const LOCK = 0x626c6f62; // 'blob'

/** Test seams, to force an interleaving; never set outside tests. */
export const blobClaimHooks: {
  /** A removal's delete, its decision made, with the sha256's lock held. */
  beforeDelete?: (sha256: string) => Promise<void>;
  /** A landing on disk about to link the held copy it chose (mirror-landing.ts). */
  beforeLink?: (sha256: string) => Promise<void>;
} = {};

/**
 * Names the blob on the landing's row, under the sha256's lock, if the store still holds it: true then; false when
 * a removal deleted it first (the row is left as it was).
 */
export async function claimBlob(db: Db, store: MirrorStore, rowId: string, sha256: string): Promise<boolean> {
  return db.$transaction(
    async (tx) => {
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${LOCK}, hashtext(${sha256}))`;
      if (!(await store.stat(sha256))) return false;
      await tx.mirrorFile.updateMany({ where: { id: rowId }, data: { actualSha256: sha256 } });
      return true;
    },
    { timeout: 60_000 },
  );
}

/**
 * Deletes the blob unless a row names it, deciding and deleting under the sha256's lock: a landing's claim waits
 * for the delete to be done, then finds the blob gone. True when it was deleted.
 */
export async function removeUnclaimedBlob(db: Db, store: MirrorStore, sha256: string): Promise<boolean> {
  return db.$transaction(
    async (tx) => {
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${LOCK}, hashtext(${sha256}))`;
      if (await tx.mirrorFile.count({ where: { actualSha256: sha256 } })) return false;
      await blobClaimHooks.beforeDelete?.(sha256);
      await store.remove(sha256);
      return true;
    },
    { timeout: 60_000 },
  );
}
