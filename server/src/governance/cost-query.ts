import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';

// The one query behind a cost report. What it computes, for the operator reading a report:
//
// - A replica's GPU time (fleet/gpu-time.ts: the GPUs it held, while LOADING or READY) costs its node's price per
//   GPU-hour, or else the price of its GPU's model, times the GPUs it held. No price: the time is counted
//   (unpricedGpuHours) but costs nothing, so a missing price shows instead of hiding in a smaller number.
// - Each minute of that time in which the replica served requests is divided among those requests by their
//   tokens (prompt + completion; by requests in a minute whose requests carried no tokens at all). A minute in
//   which it served none is idle, shown apart: the price of keeping the model ready.
// - A model with a fixed price per million tokens (setModelPrice) costs that for its calls instead, and its
//   replicas' GPU time is not priced (it would be paid twice).
//
// Money stays in PostgreSQL's numeric until it is shown: no float ever holds a cost, so a report adds up to the
// cent. One pass over the usage rows, grouped in SQL to caller × model × node × step: never a query per step.

export type CostRow = {
  kind: 'calls' | 'idle';
  bin: number;
  tokenId: string | null;
  userId: string | null;
  /** Calls: the model as the gateway recorded it. Idle: null, and modelId says whose replicas idled. */
  model: string | null;
  modelId: string | null;
  node: string;
  requests: string;
  promptTokens: string;
  completionTokens: string;
  cost: string;
  gpuHours: string;
  unpricedGpuHours: string;
};

export type CostQuery = {
  fromMs: number;
  toMs: number;
  stepMs: number;
  /** The usage rows priced (gateway's UsageService.rowsForCost). */
  usage: Prisma.Sql;
  /** The GPU time in the range (fleet's gpuTimeBetween). */
  gpuTime: Prisma.Sql;
  /** Models whose calls are priced per token: their replicas' GPU time is not priced. */
  tokenPricedModelIds: readonly string[];
  /** Whether idle GPU time is wanted (not when the report is of some callers' calls). */
  idle: boolean;
};

export function readCostRows(db: Db, q: CostQuery): Promise<CostRow[]> {
  const { fromMs: from, stepMs: step } = q;
  // Each usage row's share of its replica's minute.
  const share = Prisma.sql`CASE WHEN mt.tok > 0 THEN (u.p + u.c) / mt.tok WHEN mt.req > 0 THEN u.r / mt.req ELSE 0 END`;
  const idle = q.idle
    ? Prisma.sql`UNION ALL
      SELECT 'idle', i.bin, NULL, NULL, NULL, i."modelId", i.node, '0', '0', '0', i.cost::text, i.gh::text, i.ugh::text
      FROM idle i`
    : Prisma.empty;
  return db.$queryRaw<CostRow[]>`
    WITH u AS (${q.usage}),
    sp AS (
      SELECT s.*,
        CASE WHEN s."modelId" IN (${Prisma.join([...q.tokenPricedModelIds, ''])}) THEN 0
          ELSE coalesce(np."perGpuHour", gp."perGpuHour", 0) END * s.gpus AS rate,
        (np."perGpuHour" IS NULL AND gp."perGpuHour" IS NULL) AS unpriced
      FROM (${q.gpuTime}) s
      LEFT JOIN "Price" np ON np.target = 'NODE' AND np.name = s.node
      LEFT JOIN "Price" gp ON gp.target = 'GPU' AND gp.name = s."gpuName" AND s."gpuName" <> ''
    ),
    mt AS (SELECT "replicaId", m, sum(p + c) AS tok, sum(r) AS req FROM u GROUP BY "replicaId", m),
    busy AS (
      SELECT mt."replicaId", mt.m,
        sum(sp.rate * (least(sp.e, mt.m + 60000) - greatest(sp.s, mt.m))) / 3600000 AS cost,
        sum(sp.gpus * (least(sp.e, mt.m + 60000) - greatest(sp.s, mt.m))) / 3600000 AS gh
      FROM mt JOIN sp ON sp."replicaId" = mt."replicaId" AND sp.s < mt.m + 60000 AND sp.e > mt.m
      GROUP BY mt."replicaId", mt.m
    ),
    calls AS (
      SELECT floor((u.m - ${from}) / ${step})::int AS bin, u."tokenId", u."userId", u.model, u.node,
        sum(u.r) AS r, sum(u.p) AS p, sum(u.c) AS c,
        sum(coalesce(b.cost, 0) * ${share})
          + sum(u.p * coalesce(mp."perMillionPromptTokens", 0) + u.c * coalesce(mp."perMillionCompletionTokens", 0))
            / 1000000 AS cost,
        sum(coalesce(b.gh, 0) * ${share}) AS gh
      FROM u JOIN mt ON mt."replicaId" = u."replicaId" AND mt.m = u.m
      LEFT JOIN busy b ON b."replicaId" = u."replicaId" AND b.m = u.m
      LEFT JOIN "Price" mp ON mp.target = 'MODEL' AND mp.name = u.model
      GROUP BY 1, 2, 3, 4, 5
    ),
    held AS (
      SELECT sp."replicaId", sp."modelId", sp.node, b.bin,
        sum(sp.rate * (least(sp.e, b.hi) - greatest(sp.s, b.lo))) / 3600000 AS cost,
        sum(sp.gpus * (least(sp.e, b.hi) - greatest(sp.s, b.lo))) / 3600000 AS gh,
        sum(CASE WHEN sp.unpriced THEN sp.gpus * (least(sp.e, b.hi) - greatest(sp.s, b.lo)) ELSE 0 END) / 3600000 AS ugh
      FROM sp CROSS JOIN LATERAL (
        SELECT i AS bin, ${from} + i * ${step}::numeric AS lo, ${from} + (i + 1) * ${step}::numeric AS hi
        FROM generate_series(floor((sp.s - ${from}) / ${step})::int, ceil((sp.e - ${from}) / ${step})::int - 1) AS i
      ) b
      WHERE sp.e > sp.s
      GROUP BY 1, 2, 3, 4
    ),
    busybin AS (
      SELECT "replicaId", floor((m - ${from}) / ${step})::int AS bin, sum(cost) AS cost, sum(gh) AS gh
      FROM busy GROUP BY 1, 2
    ),
    idle AS (
      SELECT h.bin, h."modelId", h.node, sum(h.cost - coalesce(bb.cost, 0)) AS cost,
        sum(h.gh - coalesce(bb.gh, 0)) AS gh, sum(h.ugh) AS ugh
      FROM held h LEFT JOIN busybin bb ON bb."replicaId" = h."replicaId" AND bb.bin = h.bin
      GROUP BY 1, 2, 3
    )
    SELECT 'calls' AS kind, c.bin, c."tokenId", c."userId", c.model, NULL AS "modelId", c.node, c.r::text AS requests,
      c.p::text AS "promptTokens", c.c::text AS "completionTokens", c.cost::text AS cost, c.gh::text AS "gpuHours",
      '0' AS "unpricedGpuHours"
    FROM calls c
    ${idle}`;
}
