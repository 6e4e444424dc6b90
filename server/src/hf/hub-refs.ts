import type { Db, Tx } from '../db/client.js';

/** A full commit id (40 hex digits), as the Hub names one: what the mirror keeps files by. */
export const isCommit = (revision: string) => /^[0-9a-f]{40}$/.test(revision);

// What the Hub named for a branch or tag, as Hangar heard it (the HubRef table; this file is its only writer).
// The mirror keeps files by commit, and any commit of a repository can be fetched from the Hub by hand (a pull
// request's, which anyone on the Hub can open): so which commit /hf serves as `main` is not which one arrived
// last, but the one the Hub named for main when the registry resolved it for a fetch, or when pull-through listed
// it.

/**
 * A revision as a record names it: no revision (the registry's default) and HEAD are the Hub's default branch,
 * which /hf and the Hub's clients ask for as main. A repository whose default branch is not main is rare; its
 * default branch's commit then answers for main too.
 */
export function refName(revision: string | null | undefined): string {
  return !revision || revision === 'HEAD' ? 'main' : revision;
}

/**
 * Records that the Hub named `commit` for `revision` of `repo`, now (the database's clock): in the transaction
 * that writes the mirror rows of that commit where there is one, so a fetch and what it was a fetch of are kept
 * together. A revision that is itself a commit names nothing, and an answer without a commit is not recorded.
 */
export async function recordHubRef(
  db: Pick<Tx, '$executeRaw'>,
  o: { repo: string; revision: string | null | undefined; commit: string },
): Promise<void> {
  if (!isCommit(o.commit) || (o.revision && isCommit(o.revision))) return;
  // One statement, so two replicas recording the same answer at once both succeed.
  await db.$executeRaw`
    INSERT INTO "HubRef" ("repo", "ref", "commit", "at") VALUES (${o.repo.toLowerCase()}, ${refName(o.revision)}, ${o.commit}, now())
    ON CONFLICT ("repo", "ref", "commit") DO UPDATE SET "at" = now()`;
}

/** The commits the Hub named for a branch or tag of a repository, the most recently named first. */
export async function namedCommits(db: Pick<Db, 'hubRef'>, repo: string, revision: string): Promise<string[]> {
  const rows = await db.hubRef.findMany({
    where: { repo: repo.toLowerCase(), ref: refName(revision) },
    orderBy: { at: 'desc' },
    select: { commit: true },
  });
  return rows.map((r) => r.commit);
}
