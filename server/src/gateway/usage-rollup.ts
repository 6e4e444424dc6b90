import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';
import { USAGE_BUCKETS_MS } from './usage.js';

// Usage per hour (UsageHour) and per day (UsageDay), so a month's chart reads a month of days instead of every
// minute in it (#33). How they stay exact:
//
// - A statement-level trigger on UsageMinute adds what each statement wrote (its inserted rows; for an update, the
//   new rows less the old) to the hour and the day, in that statement's transaction. Whoever writes minutes (the
//   recorder's batch, a spool replayed after a crash, a script), the rollups move with them or not at all. A
//   watermark loop would have to find updated rows again (the recorder adds to existing minutes) and would lag.
// - Deleting minutes (the retention loop, usage-retention.ts) leaves the rollups as they are: that is the point.
// - The latency histogram is kept as buckets, which add up; percentiles are worked out from the sum, as before.
// - A query splits each of its steps into the days, hours and minutes that make it up (`planPieces`): whole days
//   from UsageDay, whole hours from UsageHour, and only the ragged edges from UsageMinute. Where steps start off
//   midnight or the hour, usage-plan.ts may instead read days or hours from a moved start and the edges between.
//
// Installed at every start, like the catalog's triggers (model-events.ts says why not by a migration); the
// migration 20261207170400_usage_rollups added up what UsageMinute held before.

const MINUTE_MS = 60_000;
const HOUR_MS = 60 * MINUTE_MS;
const DAY_MS = 24 * HOUR_MS;

export type Level = 'minute' | 'hour' | 'day';
/** The table and its time column per level. */
export const LEVELS: Record<Level, { table: string; at: string; ms: number }> = {
  minute: { table: 'UsageMinute', at: 'minute', ms: MINUTE_MS },
  hour: { table: 'UsageHour', at: 'hour', ms: HOUR_MS },
  day: { table: 'UsageDay', at: 'day', ms: DAY_MS },
};

/** [lo, hi) in epoch ms. */
export type Span = readonly [number, number];
export type Pieces = Record<Level, Span[]>;

/**
 * Where each level's rows may be read from (epoch ms, aligned to the next level up): minutes from `minutesFrom`,
 * hours from `hoursFrom`; older ones have been pruned (usage-retention.ts). -Infinity: kept for ever.
 */
export type Horizons = { minutesFrom: number; hoursFrom: number };

const floorTo = (ms: number, unit: number) => Math.floor(ms / unit) * unit;
const ceilTo = (ms: number, unit: number) => Math.ceil(ms / unit) * unit;

/**
 * The days, hours and minutes that make up the steps [from + i·step, from + (i+1)·step) up to `to`, coarsest first:
 * every piece lies inside one step, so a rollup row is never split between two. Adjacent pieces of a level are
 * merged (a day by minute is one range of minutes). `to` is read as the end of its minute, as the minutes are.
 */
export function planPieces(fromMs: number, toMs: number, stepMs: number, horizons?: Horizons): Pieces {
  const end = ceilTo(toMs, MINUTE_MS);
  const out: Pieces = { minute: [], hour: [], day: [] };
  const put = (level: Level, lo: number, hi: number) => {
    if (hi <= lo) return;
    const list = out[level];
    const last = list.at(-1);
    if (last && last[1] === lo) list[list.length - 1] = [last[0], hi];
    else list.push([lo, hi]);
  };
  for (let lo = fromMs; lo < end; lo += stepMs) {
    const hi = Math.min(lo + stepMs, end);
    const hLo = ceilTo(lo, HOUR_MS);
    const hHi = floorTo(hi, HOUR_MS);
    if (hLo >= hHi) {
      put('minute', lo, hi);
      continue;
    }
    put('minute', lo, hLo);
    const dLo = ceilTo(hLo, DAY_MS);
    const dHi = floorTo(hHi, DAY_MS);
    if (dLo >= dHi) put('hour', hLo, hHi);
    else {
      put('hour', hLo, dLo);
      put('day', dLo, dHi);
      put('hour', dHi, hHi);
    }
    put('minute', hHi, hi);
  }
  // put() merges only with the last piece: the minutes after a step's hours come before the next step's, so sort.
  for (const level of ['minute', 'hour', 'day'] as const) out[level] = merge(out[level]);
  if (horizons) {
    // usage.service.ts aligns a range that reaches past a horizon first; a piece there would read rows pruned.
    const early =
      out.minute.find(([lo]) => lo < horizons.minutesFrom) ?? out.hour.find(([lo]) => lo < horizons.hoursFrom);
    if (early) throw new Error(`usage: a piece from ${new Date(early[0]).toISOString()} reads pruned rows`);
  }
  return out;
}

function merge(spans: Span[]): Span[] {
  const sorted = [...spans].sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  for (const [lo, hi] of sorted) {
    const last = out.at(-1);
    if (last && last[1] >= lo) last[1] = Math.max(last[1], hi);
    else out.push([lo, hi]);
  }
  return out;
}

/** A timestamp parameter as the tables hold them: UTC, without a zone. */
export const utc = (ms: number) => Prisma.sql`(to_timestamp(${ms / 1000}) AT TIME ZONE 'UTC')`;

/**
 * The level's rows within `spans` that match `where`, as a relation named after the table: for each span, one index
 * range scan. (A plain join to the spans is planned as a scan of the whole table tested against every span, and a
 * list of ORs is tested on every row of the range; OFFSET 0 keeps PostgreSQL from flattening it back into those.)
 */
export function fromSpans(level: Level, spans: readonly Span[], where: readonly Prisma.Sql[]): Prisma.Sql {
  const { table, at } = LEVELS[level];
  const iso = (ms: number) => new Date(ms).toISOString();
  const name = Prisma.raw(`"${table}"`);
  const time = Prisma.raw(`"${at}"`);
  const also = where.length ? Prisma.sql`AND ${Prisma.join(where, ' AND ')}` : Prisma.empty;
  const [only] = spans;
  if (spans.length === 1 && only) {
    // One range: a plain WHERE, which PostgreSQL may scan with parallel workers (the lateral form never is).
    return Prisma.sql`(SELECT * FROM ${name} WHERE ${time} >= ${iso(only[0])}::timestamp AND ${time} < ${iso(only[1])}::timestamp ${also}) AS ${name}`;
  }
  // ISO text cast to a timestamp without a zone: its "Z" is dropped, which leaves the UTC time the tables hold.
  return Prisma.sql`unnest(${spans.map(([lo]) => iso(lo))}::timestamp[], ${spans.map(([, hi]) => iso(hi))}::timestamp[])
      AS s(lo, hi)
    CROSS JOIN LATERAL (
      SELECT * FROM ${name} WHERE ${time} >= s.lo AND ${time} < s.hi ${also} OFFSET 0
    ) AS ${name}`;
}

// ─── The trigger ─────────────────────────────────────────────────────────────

const KEY = `"tokenId", "userId", model, adapter, "replicaId"`;
const COUNTS = [
  'requests',
  'errors',
  'aborted',
  '"promptTokens"',
  '"completionTokens"',
  '"cachedTokens"',
  '"ttftMsSum"',
  '"ttftCount"',
  '"durationMsSum"',
];

/** Adds `source` (minute rows with a `sign` column: +1 added, -1 taken away) to the level's table. */
function addTo(level: 'hour' | 'day', source: string): string {
  const { table, at } = LEVELS[level];
  const n = USAGE_BUCKETS_MS.length;
  const cells = Array.from({ length: n }, (_, i) => `sum(sign * coalesce("durationBuckets"[${i + 1}], 0))`);
  const added = Array.from(
    { length: n },
    (_, i) => `coalesce("${table}"."durationBuckets"[${i + 1}], 0) + excluded."durationBuckets"[${i + 1}]`,
  );
  // ORDER BY the key: two transactions adding to the same hours lock them in the same order (no deadlock).
  return `
    INSERT INTO "${table}" ("${at}", ${KEY}, node, ${COUNTS.join(', ')}, "durationBuckets")
    SELECT date_trunc('${level}', minute), ${KEY}, max(node), ${COUNTS.map((c) => `sum(sign * ${c})`).join(', ')},
      ARRAY[${cells.join(', ')}]::bigint[]
    FROM (${source}) s
    GROUP BY date_trunc('${level}', minute), ${KEY}
    ORDER BY 1, ${KEY}
    ON CONFLICT ("${at}", ${KEY}) DO UPDATE SET
      ${COUNTS.map((c) => `${c} = "${table}".${c} + excluded.${c}`).join(',\n      ')},
      "durationBuckets" = ARRAY[${added.join(', ')}]`;
}

const COLUMNS = `minute, ${KEY}, node, ${COUNTS.join(', ')}, "durationBuckets"`;

function triggerFunction(name: string, source: string): string {
  return `
CREATE OR REPLACE FUNCTION ${name}() RETURNS trigger AS $$
BEGIN
  ${addTo('hour', source)};
  ${addTo('day', source)};
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;
}

const LOCK = 0x75736167; // 'usag'

/** Installs (or replaces) the triggers that keep UsageHour and UsageDay equal to UsageMinute's sums. */
export async function installUsageRollups(db: Db): Promise<void> {
  await db.$transaction(async (tx) => {
    await tx.$executeRaw`SELECT pg_advisory_xact_lock(${LOCK})`;
    await tx.$executeRawUnsafe(
      triggerFunction('hangar_usage_rollup_insert', `SELECT ${COLUMNS}, 1 AS sign FROM new_rows`),
    );
    await tx.$executeRawUnsafe(
      triggerFunction(
        'hangar_usage_rollup_update',
        `SELECT ${COLUMNS}, 1 AS sign FROM new_rows UNION ALL SELECT ${COLUMNS}, -1 AS sign FROM old_rows`,
      ),
    );
    await tx.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "UsageMinute_rollup_insert" ON "UsageMinute"`);
    await tx.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "UsageMinute_rollup_update" ON "UsageMinute"`);
    await tx.$executeRawUnsafe(
      `CREATE TRIGGER "UsageMinute_rollup_insert" AFTER INSERT ON "UsageMinute" REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION hangar_usage_rollup_insert()`,
    );
    await tx.$executeRawUnsafe(
      `CREATE TRIGGER "UsageMinute_rollup_update" AFTER UPDATE ON "UsageMinute"
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION hangar_usage_rollup_update()`,
    );
  });
}
