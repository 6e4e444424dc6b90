import { ownedAdapterIn, ownedMirrorAdaptersSql } from '../catalog/catalog-store.js';
import type { Db, Tx } from '../db/client.js';
import { ownedJobsSql, ownerOfJobOutput } from '../train/train-store.js';
import { mirrorVersionsIn, sourceKey } from './mirror-view.js';

// Which mirror versions have an owner: a trained adapter published for a team (or a user, a key) is served only
// to those its owner admits (serve.ts), and its bytes are reused for another version only for them
// (mirror-landing.ts). One answer for both, so the file a reader may not fetch is also one they may not copy.

/** The owner of a mirror version, when it is a trained adapter that has one; its catalog model when published. */
export async function versionOwner(
  db: Db | Tx,
  model: string,
  version: string,
): Promise<{ owner: string; modelId: string | null } | null> {
  const adapter = await ownedAdapterIn(db, model, version);
  if (adapter?.owner) return { owner: adapter.owner, modelId: adapter.modelId };
  // publishTrainJob puts the files in the mirror (as version job-<first 8 of the job id>) before the adapter row
  // exists: in between, the job's owner is the file's.
  const m = /^job-([0-9a-f]{8})$/.exec(version);
  if (!m) return null;
  const owner = await ownerOfJobOutput(db, model, m[1] as string);
  return owner ? { owner, modelId: null } : null;
}

/**
 * versionOwner for every version at once: each version's owners (usually one), by sourceKey (model/version as a
 * source URL spells them). One statement (the catalog's adapters and training's jobs, each as its owner writes
 * it), for the Mirror listing (5000 versions), where versionOwner for each would be a query a row; the same two
 * rules: an owned adapter's source points into it, or it is an owned job's job-<first 8 of its id>.
 */
export async function versionOwners(db: Db | Tx): Promise<Map<string, string[]>> {
  // Each owner writes the SQL for its own table; the union keeps it one statement.
  const rows = await db.$queryRaw<{ source: string | null; job: string | null; id: string | null; owner: string }[]>`
    SELECT source, NULL::text AS job, NULL::text AS id, owner FROM (${ownedMirrorAdaptersSql()}) adapters
    UNION ALL
    SELECT NULL, name, id, owner FROM (${ownedJobsSql()}) jobs`;
  const owners = new Map<string, string[]>();
  const add = (key: string, owner: string) => {
    const list = owners.get(key) ?? [];
    if (!list.includes(owner)) list.push(owner);
    owners.set(key, list);
  };
  for (const r of rows) {
    if (r.source !== null) for (const key of mirrorVersionsIn(r.source)) add(key, r.owner);
    else if (r.job !== null && r.id !== null) add(sourceKey(r.job, `job-${r.id.slice(0, 8)}`), r.owner);
  }
  return owners;
}
