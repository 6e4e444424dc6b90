import type { Db, Tx } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';

// Training jobs belong to train (db/owners.ts). Other domains read them only through these functions (their
// owner, what an owner holds), so test/table-owners.test.ts can hold every other folder to that. Each takes the
// client to use: a caller's transaction when the answer must hold for what it writes, the requests' otherwise.

type Client = Db | Tx;

/** A job's owner by its id; null for an unowned job or none. */
export async function ownerOfJob(db: Client, id: string): Promise<string | null> {
  return (await db.trainJob.findUnique({ where: { id }, select: { owner: true } }))?.owner ?? null;
}

/**
 * The owner of the owned job named `name` whose id starts with `idPrefix` (its output's mirror version is
 * job-<first 8 of its id>, see publishTrainJob); null when there is none.
 */
export async function ownerOfJobOutput(db: Client, name: string, idPrefix: string): Promise<string | null> {
  const jobs = await db.$queryRaw<{ owner: string | null }[]>`
    SELECT owner FROM "TrainJob" WHERE name = ${name} AND id::text LIKE ${`${idPrefix}%`} AND owner IS NOT NULL LIMIT 1`;
  return jobs[0]?.owner ?? null;
}

/**
 * SQL selecting every owned job as (name, id as text, owner): the Mirror listing unions it with the catalog's owned
 * adapters in one statement (mirror/owned.ts versionOwners).
 */
export function ownedJobsSql(): Prisma.Sql {
  return Prisma.sql`SELECT name, id::text AS id, owner FROM "TrainJob" WHERE owner IS NOT NULL`;
}

/** The names of the jobs these owner keys hold, by name (what deleting an owner would orphan). */
export async function jobsHeldBy(db: Client, keys: string[]): Promise<string[]> {
  const jobs = await db.trainJob.findMany({
    where: { owner: { in: keys } },
    select: { name: true },
    orderBy: { name: 'asc' },
  });
  return jobs.map((j) => j.name);
}

/**
 * Whether training keeps bytes with this sha256 (a job's pairs or evaluation file, what a job made): in a bucket,
 * blobs are shared by sha256 with the mirror, so the mirror's removal leaves these (mirror/on-bucket.ts), and a
 * published adapter's blob outlives its job while its mirror version stands.
 */
export async function blobHeldByTraining(db: Client, sha256: string): Promise<boolean> {
  const [jobs, arts] = await Promise.all([
    db.trainJob.count({ where: { OR: [{ dataSha256: sha256 }, { evalDataSha256: sha256 }] } }),
    db.trainArtifact.count({ where: { sha256 } }),
  ]);
  return jobs + arts > 0;
}
