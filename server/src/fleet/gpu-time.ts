import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';

// What each replica held of its node's GPUs, and for how long: the time a price per GPU-hour is applied to
// (governance/cost.service.ts). A replica holds GPUs from when it is LOADING until it is no longer READY (its
// weights take the memory while they load, whether or not it answers yet). Replica states are written from many
// places (placement, agents' reports, smoke tests, the sweeps that mark a node's replicas LOST), so the database
// records the spans itself, with a trigger on "Replica", in the transaction that changed the state and on its
// clock: no path can forget one, and two server processes cannot disagree about when a span began.
//
// Installed at every start rather than by a migration, as catalog/model-events.ts is (a PL/pgSQL body is full of
// semicolons, on which Prisma's engine splits a migration). The start also mends what happened without the
// trigger (replicas that held GPUs before it existed): every holding replica gets an open span, and an open span
// of a replica that holds nothing any more is closed.

const HOLDS = `r.state IN ('LOADING', 'READY') AND r."nodeId" IS NOT NULL`;

/** The GPUs a replica on `n` (a "Node" row) at `gpu` (its gpuIndex) holds, and their model's name. */
const GPUS = (n: string, gpu: string) => `CASE WHEN ${gpu} IS NOT NULL THEN 1
    WHEN jsonb_typeof(${n}.gpus) = 'array' THEN greatest(1, jsonb_array_length(${n}.gpus)) ELSE 1 END`;
const GPU_NAME = (n: string, gpu: string) => `coalesce(CASE WHEN jsonb_typeof(${n}.gpus) <> 'array' THEN NULL
    WHEN ${gpu} IS NULL THEN ${n}.gpus -> 0 ->> 'name'
    ELSE (SELECT g ->> 'name' FROM jsonb_array_elements(${n}.gpus) g WHERE (g ->> 'index')::int = ${gpu} LIMIT 1)
  END, '')`;

const FUNCTION = `
CREATE OR REPLACE FUNCTION hangar_gpu_time() RETURNS trigger AS $$
DECLARE
  held boolean := false;
  holds boolean := false;
  at timestamp(3) := now() AT TIME ZONE 'UTC';
BEGIN
  IF TG_OP <> 'INSERT' THEN held := OLD.state IN ('LOADING', 'READY') AND OLD."nodeId" IS NOT NULL; END IF;
  IF TG_OP <> 'DELETE' THEN holds := NEW.state IN ('LOADING', 'READY') AND NEW."nodeId" IS NOT NULL; END IF;
  IF held AND holds AND OLD."nodeId" = NEW."nodeId" AND OLD."gpuIndex" IS NOT DISTINCT FROM NEW."gpuIndex" THEN
    RETURN NULL;
  END IF;
  IF held THEN
    UPDATE "GpuTime" SET "endedAt" = at WHERE "replicaId" = OLD.id AND "endedAt" IS NULL;
  END IF;
  IF holds THEN
    INSERT INTO "GpuTime" ("replicaId", "modelId", "node", "gpuName", "gpus", "startedAt")
    SELECT NEW.id, NEW."modelId", n.name, ${GPU_NAME('n', 'NEW."gpuIndex"')}, ${GPUS('n', 'NEW."gpuIndex"')}, at
    FROM "Node" n WHERE n.id = NEW."nodeId";
  END IF;
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;

const LOCK = 0x67707574; // 'gput'

export async function installGpuTime(db: Db): Promise<void> {
  await db.$transaction(async (tx) => {
    await tx.$executeRaw`SELECT pg_advisory_xact_lock(${LOCK})`;
    await tx.$executeRawUnsafe(FUNCTION);
    await tx.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "Replica_gpu_time" ON "Replica"`);
    await tx.$executeRawUnsafe(
      `CREATE TRIGGER "Replica_gpu_time" AFTER INSERT OR DELETE OR UPDATE OF state, "nodeId", "gpuIndex" ON "Replica" FOR EACH ROW EXECUTE FUNCTION hangar_gpu_time()`,
    );
    await tx.$executeRawUnsafe(`UPDATE "GpuTime" g SET "endedAt" = now() AT TIME ZONE 'UTC'
      WHERE g."endedAt" IS NULL AND NOT EXISTS (SELECT 1 FROM "Replica" r WHERE r.id = g."replicaId" AND ${HOLDS})`);
    await tx.$executeRawUnsafe(`INSERT INTO "GpuTime" ("replicaId", "modelId", "node", "gpuName", "gpus", "startedAt")
      SELECT r.id, r."modelId", n.name, ${GPU_NAME('n', 'r."gpuIndex"')}, ${GPUS('n', 'r."gpuIndex"')}, now() AT TIME ZONE 'UTC'
      FROM "Replica" r JOIN "Node" n ON n.id = r."nodeId"
      WHERE ${HOLDS}
        AND NOT EXISTS (SELECT 1 FROM "GpuTime" g WHERE g."replicaId" = r.id AND g."endedAt" IS NULL)`);
  });
}

/**
 * The spans that overlap [from, to), clipped to it, for the cost report to join in its one query: columns
 * "replicaId" (text), "modelId" (text), node, "gpuName", gpus, and the span's bounds as epoch milliseconds
 * (numeric) s and e. An open span runs to the database's now. The fleet owns the table; this is its read.
 */
export function gpuTimeBetween(from: Date, to: Date, modelIds?: readonly string[]): Prisma.Sql {
  const lo = from.getTime();
  const hi = to.getTime();
  const ms = (col: Prisma.Sql) => Prisma.sql`(extract(epoch FROM ${col}) * 1000)::numeric`;
  const end = Prisma.sql`coalesce(g."endedAt", now() AT TIME ZONE 'UTC')`;
  const at = (t: number) => Prisma.sql`(to_timestamp(${t / 1000}) AT TIME ZONE 'UTC')`;
  const only = modelIds ? Prisma.sql`AND g."modelId"::text IN (${Prisma.join([...modelIds, ''])})` : Prisma.empty;
  return Prisma.sql`
    SELECT g."replicaId"::text AS "replicaId", g."modelId"::text AS "modelId", g.node, g."gpuName", g.gpus,
      greatest(${ms(Prisma.sql`g."startedAt"`)}, ${lo}::numeric) AS s, least(${ms(end)}, ${hi}::numeric) AS e
    FROM "GpuTime" g
    WHERE g."startedAt" < ${at(hi)} AND (g."endedAt" IS NULL OR g."endedAt" > ${at(lo)}) ${only}`;
}
