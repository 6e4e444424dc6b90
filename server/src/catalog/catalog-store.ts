import type { Db, Tx } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';
import type { VersionUse } from '../mirror/mirror-view.js';

// Catalog models and adapters belong to the catalog (db/owners.ts). Other domains read and write them only
// through these functions, so test/table-owners.test.ts can hold every other folder to that and a change to their
// columns is made here once. Each takes the client to use: a caller's transaction when the read or write must
// commit with the caller's own (a trained adapter is registered with its job's event and audit row), the
// requests' or loops' client otherwise.

type Client = Db | Tx;

/** A catalog model by name. */
export function modelByName(db: Client, name: string) {
  return db.catalogModel.findUnique({ where: { name } });
}

/** Whether a model or an adapter has this name: requests name either, so a new one must not take it. */
export async function nameTaken(db: Client, name: string): Promise<boolean> {
  return Boolean(
    (await db.catalogModel.findUnique({ where: { name }, select: { id: true } })) ??
      (await db.adapter.findUnique({ where: { name }, select: { id: true } })),
  );
}

/** The owner of the model or adapter with this name (a model's first: names are shared), null when none. */
export async function ownerOfName(db: Client, name: string): Promise<string | null> {
  return (
    (await db.catalogModel.findUnique({ where: { name }, select: { owner: true } }))?.owner ??
    (await db.adapter.findUnique({ where: { name }, select: { owner: true } }))?.owner ??
    null
  );
}

/** The owned adapter whose source points into this mirror version, with the model it runs on. */
export function ownedAdapterIn(db: Client, model: string, version: string) {
  return db.adapter.findFirst({
    where: {
      owner: { not: null },
      source: { contains: `/mirror/${encodeURIComponent(model)}/${encodeURIComponent(version)}/` },
    },
    select: { owner: true, modelId: true },
  });
}

/**
 * SQL selecting every owned adapter whose source is in the mirror, as (source, owner): the Mirror listing unions it
 * with training's owned jobs in one statement (mirror/owned.ts versionOwners), its cost at 5000 versions.
 */
export function ownedMirrorAdaptersSql(): Prisma.Sql {
  return Prisma.sql`SELECT source, owner FROM "Adapter" WHERE owner IS NOT NULL AND source LIKE '%/mirror/%'`;
}

/** A model or adapter whose source is in the mirror, as the Mirror's "used by" shows it, with that source. */
export type MirrorSourceUse = VersionUse & { source: string };

/**
 * Every model and adapter whose source is in the mirror, models first. One statement rather than two findMany:
 * most of their cost at 5000 versions is Prisma's own, per call (the Mirror listing asks for all of them).
 */
export function mirrorSourceUses(db: Client): Promise<MirrorSourceUse[]> {
  // An adapter runs on its model's replicas: they are what fail to load it without its version.
  return db.$queryRaw<MirrorSourceUse[]>`
      SELECT * FROM (
        SELECT name, source, "minReplicas", "maxReplicas", declared, NULL::text AS "adapterOf",
               array_remove(ARRAY[owner], NULL) AS owners
          FROM "CatalogModel" WHERE source LIKE '%/mirror/%'
        UNION ALL
        SELECT a.name, a.source, m."minReplicas", m."maxReplicas", false, m.name,
               array_remove(ARRAY[a.owner, m.owner], NULL)
          FROM "Adapter" a JOIN "CatalogModel" m ON m.id = a."modelId" WHERE a.source LIKE '%/mirror/%'
      ) uses ORDER BY "adapterOf" IS NOT NULL, name`;
}

/** The names of the models and adapters these owner keys hold, by name (what deleting an owner would orphan). */
export async function heldBy(db: Client, keys: string[]): Promise<{ models: string[]; adapters: string[] }> {
  const [models, adapters] = await Promise.all([
    db.catalogModel.findMany({ where: { owner: { in: keys } }, select: { name: true }, orderBy: { name: 'asc' } }),
    db.adapter.findMany({ where: { owner: { in: keys } }, select: { name: true }, orderBy: { name: 'asc' } }),
  ]);
  return { models: models.map((m) => m.name), adapters: adapters.map((a) => a.name) };
}

/** Every catalog model, as the placement pass weighs them (under its lock, in its transaction). */
export function modelsForPlacement(tx: Client) {
  return tx.catalogModel.findMany();
}

/** The models the autoscaler samples: those with a target in flight (the others keep their fixed count). */
export function autoscaledModels(tx: Client) {
  return tx.catalogModel.findMany({ where: { targetInFlight: { not: null } } });
}

/** What a fully offloaded replica measured its model to need, written back on the model in the fleet's report. */
export async function recordMeasuredSize(tx: Tx, modelId: string, bytes: bigint | number): Promise<void> {
  await tx.catalogModel.update({
    where: { id: modelId },
    data: { measuredMemoryBytes: bytes, measuredAt: new Date() },
  });
}

/** A trained adapter, registered in the publishing job's transaction (its event and audit row go with it). */
export async function addAdapter(tx: Tx, data: Prisma.AdapterUncheckedCreateInput): Promise<void> {
  await tx.adapter.create({ data });
}

/** The name of the adapter a training job was published as, if it was. */
export function adapterOfJob(db: Client, trainJobId: string) {
  return db.adapter.findFirst({ where: { trainJobId }, select: { name: true } });
}

/**
 * Every catalog model (or those of `ids`) with its adapters' names and owners: the catalog's half of the gateway's
 * route table, read whole at start and now and then, and model by model as their events come.
 */
export function routingModels(db: Client, ids?: readonly string[]) {
  return db.catalogModel.findMany({
    ...(ids ? { where: { id: { in: [...ids] } } } : {}),
    include: { adapters: { select: { name: true, owner: true } } },
  });
}

/**
 * SQL that is true for a usage row (`row` names its table, with columns model and adapter) unless its model or
 * adapter has an owner outside `owners`: the catalog's owner filter, composed into the usage statement as two
 * anti-joins on the names' unique indexes (no query per row). A row of a name no longer in the catalog stays:
 * nothing owns it now.
 */
export function seenByOwnersSql(row: Prisma.Sql, owners: string[]): Prisma.Sql {
  const foreign = (column: Prisma.Sql) =>
    owners.length ? Prisma.sql`AND NOT (${column} IN (${Prisma.join(owners)}))` : Prisma.empty;
  return Prisma.sql`NOT EXISTS (SELECT 1 FROM "CatalogModel" m
      WHERE m.name = ${row}.model AND m.owner IS NOT NULL ${foreign(Prisma.sql`m.owner`)})
    AND NOT EXISTS (SELECT 1 FROM "Adapter" a
      WHERE a.name = ${row}.adapter AND a.owner IS NOT NULL ${foreign(Prisma.sql`a.owner`)})`;
}

/** Models' names by id, in one query, keyed by id (one deleted since is missing). */
export async function modelNamesByIds(db: Client, ids: string[]): Promise<Map<string, string>> {
  const models = ids.length
    ? await db.catalogModel.findMany({ where: { id: { in: [...new Set(ids)] } }, select: { id: true, name: true } })
    : [];
  return new Map(models.map((m) => [m.id, m.name]));
}
