import type { Db } from '../db/client.js';
import { installTriggers } from '../db/triggers.js';
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

/** The name of the GPU model at index `gpu` of `n` (a "Node" row); its first card's when `gpu` is null. */
const GPU_NAME = (n: string, gpu: string) => `coalesce(CASE WHEN jsonb_typeof(${n}.gpus) <> 'array' THEN NULL
    WHEN ${gpu} IS NULL THEN ${n}.gpus -> 0 ->> 'name'
    ELSE (SELECT g ->> 'name' FROM jsonb_array_elements(${n}.gpus) g WHERE (g ->> 'index')::int = ${gpu} LIMIT 1)
  END, '')`;

// A card shared by several replicas (placement books cards by memory: fleet/gpu-room.ts) is not paid for twice:
// each card's time is divided equally among the replicas holding it at that moment, so a node's spans add up to
// its cards' time whatever shares them. A replica's share is the sum over the cards it holds: 1 for a card of its
// own, ½ for a card it shares with one other, 2 for a model split over two cards of its own. A replica given the
// node as a whole (no GPU index) holds every card; a node that reported no GPU counts as one unit, shared the same
// way. When the holders of a node change, the open spans of that node whose share changed are closed and reopened
// at the new share (each span has one share for its whole length, so a cost is share × length, as before).
const FUNCTION = `
CREATE OR REPLACE FUNCTION hangar_gpu_shares(node_id uuid)
RETURNS TABLE (id uuid, "modelId" uuid, node text, "gpuName" text, gpus numeric) AS $$
  WITH n AS (SELECT id, name, gpus FROM "Node" WHERE id = node_id),
  every_card AS (
    SELECT coalesce(array_agg((g ->> 'index')::int), ARRAY[]::int[]) AS c
    FROM n, jsonb_array_elements(CASE WHEN jsonb_typeof(n.gpus) = 'array' THEN n.gpus ELSE '[]'::jsonb END) g
  ),
  holding AS (
    SELECT r.id, r."modelId",
      CASE WHEN cardinality(r."gpuIndexes") > 0 THEN r."gpuIndexes"
        WHEN r."gpuIndex" IS NOT NULL THEN ARRAY[r."gpuIndex"]
        WHEN cardinality((SELECT c FROM every_card)) > 0 THEN (SELECT c FROM every_card)
        ELSE ARRAY[-1] END AS cards
    FROM "Replica" r WHERE r."nodeId" = node_id AND r.state IN ('LOADING', 'READY')
  ),
  per_card AS (SELECT h.id, c FROM holding h, unnest(h.cards) c),
  holders AS (SELECT c, count(*) AS k FROM per_card GROUP BY c)
  SELECT h.id, h."modelId", n.name, ${GPU_NAME('n', 'h.cards[1]')}, round(sum(1.0 / hd.k), 6)
  FROM holding h CROSS JOIN n JOIN per_card pc ON pc.id = h.id JOIN holders hd ON hd.c = pc.c
  GROUP BY h.id, h."modelId", h.cards, n.name, n.gpus
$$ LANGUAGE sql STABLE;

CREATE OR REPLACE FUNCTION hangar_gpu_time_node(node_id uuid, at timestamp(3)) RETURNS void AS $$
BEGIN
  UPDATE "GpuTime" g SET "endedAt" = at
  WHERE g."endedAt" IS NULL AND g.node = (SELECT name FROM "Node" WHERE id = node_id)
    AND NOT EXISTS (SELECT 1 FROM hangar_gpu_shares(node_id) w WHERE w.id = g."replicaId" AND w.gpus = g.gpus);
  -- A share that changed again within one transaction leaves no span of no length behind.
  DELETE FROM "GpuTime" g WHERE g."endedAt" = at AND g."startedAt" = at;
  INSERT INTO "GpuTime" ("replicaId", "modelId", "node", "gpuName", "gpus", "startedAt")
  SELECT w.id, w."modelId", w.node, w."gpuName", w.gpus, at FROM hangar_gpu_shares(node_id) w
  WHERE NOT EXISTS (SELECT 1 FROM "GpuTime" g WHERE g."replicaId" = w.id AND g."endedAt" IS NULL);
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION hangar_gpu_time() RETURNS trigger AS $$
DECLARE
  held boolean := false;
  holds boolean := false;
  at timestamp(3) := now() AT TIME ZONE 'UTC';
BEGIN
  IF TG_OP <> 'INSERT' THEN held := OLD.state IN ('LOADING', 'READY') AND OLD."nodeId" IS NOT NULL; END IF;
  IF TG_OP <> 'DELETE' THEN holds := NEW.state IN ('LOADING', 'READY') AND NEW."nodeId" IS NOT NULL; END IF;
  IF held AND holds AND OLD."nodeId" = NEW."nodeId" AND OLD."gpuIndex" IS NOT DISTINCT FROM NEW."gpuIndex"
    AND OLD."gpuIndexes" = NEW."gpuIndexes" THEN
    RETURN NULL;
  END IF;
  IF NOT held AND NOT holds THEN RETURN NULL; END IF;
  -- Its own span first: its node may be gone (a removed node sets its replicas' node to null).
  IF held THEN
    UPDATE "GpuTime" SET "endedAt" = at WHERE "replicaId" = OLD.id AND "endedAt" IS NULL;
    PERFORM hangar_gpu_time_node(OLD."nodeId", at);
  END IF;
  -- Its new node's shares (the same node was recomputed above).
  IF holds AND (NOT held OR OLD."nodeId" <> NEW."nodeId") THEN
    PERFORM hangar_gpu_time_node(NEW."nodeId", at);
  END IF;
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;

const LOCK = 0x67707574; // 'gput'

export async function installGpuTime(db: Db): Promise<void> {
  await installTriggers(db, {
    lock: LOCK,
    // One statement per function: a prepared statement holds one command.
    functions: FUNCTION.split(/(?<=\$\$ LANGUAGE \w+(?: STABLE)?);\n/),
    triggers: [
      {
        name: 'Replica_gpu_time',
        table: 'Replica',
        create: `CREATE TRIGGER "Replica_gpu_time" AFTER INSERT OR DELETE OR UPDATE OF state, "nodeId", "gpuIndex", "gpuIndexes" ON "Replica" FOR EACH ROW EXECUTE FUNCTION hangar_gpu_time()`,
      },
    ],
    // Spans as the new trigger would have kept them: those of replicas that hold no card any more closed, and
    // every node's shares opened as they are now (replicas that held GPUs before the trigger existed get one).
    // Once installed, the trigger keeps them in the transaction of every change.
    catchUp: async (tx) => {
      await tx.$executeRawUnsafe(`UPDATE "GpuTime" g SET "endedAt" = now() AT TIME ZONE 'UTC'
      WHERE g."endedAt" IS NULL AND NOT EXISTS (SELECT 1 FROM "Replica" r WHERE r.id = g."replicaId" AND ${HOLDS})`);
      await tx.$executeRawUnsafe(
        `SELECT hangar_gpu_time_node(id, (now() AT TIME ZONE 'UTC')::timestamp(3)) FROM "Node"`,
      );
    },
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
    SELECT g."replicaId"::text AS "replicaId", g."modelId"::text AS "modelId", g.node, g."gpuName", g.gpus::numeric AS gpus,
      greatest(${ms(Prisma.sql`g."startedAt"`)}, ${lo}::numeric) AS s, least(${ms(end)}, ${hi}::numeric) AS e
    FROM "GpuTime" g
    WHERE g."startedAt" < ${at(hi)} AND (g."endedAt" IS NULL OR g."endedAt" > ${at(lo)}) ${only}`;
}
