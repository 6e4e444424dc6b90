import type { Db } from '../db/client.js';
import { installTriggers } from '../db/triggers.js';
import { Prisma } from '../generated/prisma/client.js';
import { USAGE_BUCKETS_MS } from './usage.js';

// Usage per hour (UsageHour) and per day (UsageDay), so a month's chart reads a month of days instead of every
// minute in it (#33), and each day from midnight up to each of its hours (UsageDayPrefix), so a step that starts at
// 10:17 reads midnight to 10:00 as one row per caller instead of ten hours, and per quarter hour (UsageQuarter), so
// its 17 minutes are a quarter and two minutes. How they stay exact:
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

/**
 * Each day from midnight up to each of its hours (UsageDayPrefix): the row for [day, until) sums the hours in it.
 * Read only by usage-plan.ts's regions; pruned with the hours, since it is made of them.
 */
export const PREFIX = { table: 'UsageDayPrefix', at: 'day' } as const;

/**
 * Usage per quarter hour (UsageQuarter): the ragged edge of a step, 10:00 to 10:17, is a quarter and two minutes.
 * Read only by usage-plan.ts's regions; pruned with the minutes (once they are gone, steps are whole hours).
 */
export const QUARTER = { table: 'UsageQuarter', at: 'quarter', ms: 15 * MINUTE_MS } as const;
/** A minute's quarter hour, as the trigger and the migration 20261208000110_usage_quarter write it. */
const QUARTER_START = `date_bin('15 minutes', minute, TIMESTAMP '2000-01-01')`;

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
function addTo(level: 'quarter' | 'hour' | 'day', source: string): string {
  const { table, at } = level === 'quarter' ? QUARTER : LEVELS[level];
  const start = level === 'quarter' ? QUARTER_START : `date_trunc('${level}', minute)`;
  const n = USAGE_BUCKETS_MS.length;
  const cells = Array.from({ length: n }, (_, i) => `sum(sign * coalesce("durationBuckets"[${i + 1}], 0))`);
  const added = Array.from(
    { length: n },
    (_, i) => `coalesce("${table}"."durationBuckets"[${i + 1}], 0) + excluded."durationBuckets"[${i + 1}]`,
  );
  // ORDER BY the key: two transactions adding to the same hours lock them in the same order (no deadlock).
  return `
    INSERT INTO "${table}" ("${at}", ${KEY}, node, ${COUNTS.join(', ')}, "durationBuckets")
    SELECT ${start}, ${KEY}, max(node), ${COUNTS.map((c) => `sum(sign * ${c})`).join(', ')},
      ARRAY[${cells.join(', ')}]::bigint[]
    FROM (${source}) s
    GROUP BY ${start}, ${KEY}
    ORDER BY 1, ${KEY}
    ON CONFLICT ("${at}", ${KEY}) DO UPDATE SET
      ${COUNTS.map((c) => `${c} = "${table}".${c} + excluded.${c}`).join(',\n      ')},
      "durationBuckets" = ARRAY[${added.join(', ')}]`;
}

/**
 * Adds `source` to UsageDayPrefix: each minute row to every prefix of its day (midnight to `until`, a whole hour)
 * that ends after its hour, so the prefix to 10:00 is the hours 00:00–09:00. Summed per hour first: a statement's
 * rows fan out to at most 23 prefixes per caller and hour, not per minute.
 */
function addToPrefix(source: string): string {
  const { table } = PREFIX;
  const buckets = USAGE_BUCKETS_MS.map((_, i) => `b${i + 1}`);
  const added = buckets.map(
    (_, i) => `coalesce("${table}"."durationBuckets"[${i + 1}], 0) + excluded."durationBuckets"[${i + 1}]`,
  );
  return `
    INSERT INTO "${table}" (day, until, ${KEY}, node, ${COUNTS.join(', ')}, "durationBuckets")
    SELECT date_trunc('day', h.hour), u.until, ${KEY}, max(node), ${COUNTS.map((c) => `sum(${c})`).join(', ')},
      ARRAY[${buckets.map((b) => `sum(${b})`).join(', ')}]::bigint[]
    FROM (
      SELECT date_trunc('hour', minute) AS hour, ${KEY}, max(node) AS node,
        ${COUNTS.map((c) => `sum(sign * ${c}) AS ${c}`).join(', ')},
        ${buckets.map((b, i) => `sum(sign * coalesce("durationBuckets"[${i + 1}], 0)) AS ${b}`).join(', ')}
      FROM (${source}) s
      GROUP BY 1, ${KEY}
    ) h
      CROSS JOIN LATERAL generate_series(h.hour + interval '1 hour', date_trunc('day', h.hour) + interval '23 hours',
        interval '1 hour') AS u(until)
    GROUP BY 1, 2, ${KEY}
    ORDER BY 1, 2, ${KEY}
    ON CONFLICT (day, until, ${KEY}) DO UPDATE SET
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
  ${addTo('quarter', source)};
  ${addToPrefix(source)};
  RETURN NULL;
END
$$ LANGUAGE plpgsql`;
}

const LOCK = 0x75736167; // 'usag'

/** Installs (or replaces) the triggers that keep the rollups (UsageQuarter, UsageHour, UsageDay, UsageDayPrefix) equal to UsageMinute's sums. */
export async function installUsageRollups(db: Db): Promise<void> {
  await installTriggers(db, {
    lock: LOCK,
    functions: [
      triggerFunction('hangar_usage_rollup_insert', `SELECT ${COLUMNS}, 1 AS sign FROM new_rows`),
      triggerFunction(
        'hangar_usage_rollup_update',
        `SELECT ${COLUMNS}, 1 AS sign FROM new_rows UNION ALL SELECT ${COLUMNS}, -1 AS sign FROM old_rows`,
      ),
    ],
    triggers: [
      {
        name: 'UsageMinute_rollup_insert',
        table: 'UsageMinute',
        create: `CREATE TRIGGER "UsageMinute_rollup_insert" AFTER INSERT ON "UsageMinute" REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION hangar_usage_rollup_insert()`,
      },
      {
        name: 'UsageMinute_rollup_update',
        table: 'UsageMinute',
        create: `CREATE TRIGGER "UsageMinute_rollup_update" AFTER UPDATE ON "UsageMinute"
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION hangar_usage_rollup_update()`,
      },
    ],
  });
}
