import { Prisma } from '../generated/prisma/client.js';
import { USAGE_BUCKETS_MS } from './usage.js';
import {
  type Horizons,
  LEVELS,
  type Level,
  type Pieces,
  PREFIX,
  planPieces,
  QUARTER,
  type Span,
} from './usage-rollup.js';

// Which rows answer a usage query whose steps start off the hour or off midnight (#33). planPieces reads each step
// as the days, hours and minutes inside it: a day's step from 10:17 is 23 hour rows and an hour of minutes, per
// step. Sums can also be taken away, so the same step is the day from midnight, less the minutes and hours from
// midnight to 10:17, plus the same stretch of the next day:
//
//   [x_i, x_{i+1}) = [a_i, a_{i+1}) − [a_i, x_i) + [a_{i+1}, x_{i+1})      (a_i: x_i moved to a midnight, or an hour)
//
// which holds for any a_i as signed ranges. The middle is whole days (or hours) read once, each row added to its
// step; each edge [a_i, x_i) is read once and added to one step and taken from the next. For a month by day from
// 10:17 that is a day row and 10 h 17 min per step instead of 23 h 60 min. Whether it pays depends on how many rows
// each level keeps per hour (many callers: hours compress little), so every way is priced with the tables'
// statistics (`Density`) and the cheapest read. All are exact: counts are whole numbers, and a float8 holds them
// exactly up to 2^53; only the float sums (ttftMsSum) may differ from a plain sum in their last bits.
//
// The stretch from midnight to 10:00 is also one row per caller in UsageDayPrefix (usage-rollup.ts), and the stretch
// from 10:00 to the next midnight the day less that prefix; and any run of minutes is whole quarter hours
// (UsageQuarter) and the minutes left at its ends. So the edge [midnight, 10:17) reads a prefix row, a quarter row
// and two minutes per caller instead of ten hours and 17 minutes.

const MINUTE_MS = 60_000;
const HOUR_MS = 60 * MINUTE_MS;
const DAY_MS = 24 * HOUR_MS;

/** Rows each level holds per hour of time (any scale: only the ratios matter). */
export type Density = Record<Level, number>;
/** When nothing better is known: hours keep a sixth of the minutes' rows, days an eighth of the hours'. */
export const DEFAULT_DENSITY: Density = { minute: 60, hour: 10, day: 1.25 };

/**
 * What a region reads: a level's rows within its span (also 'quarter': UsageQuarter), or ('prefix') the day prefix
 * from span[0] to span[1].
 */
export type ReadLevel = Level | 'quarter' | 'prefix';

/** The table a region of `level` reads, and its time column. */
export function tableOf(level: ReadLevel): { table: string; at: string } {
  return level === 'prefix' ? PREFIX : level === 'quarter' ? QUARTER : LEVELS[level];
}

/** A range of one level read once, its sum added (sign +1) or taken away (−1) from each step listed. */
export type Region = { level: ReadLevel; span: Span; to: { bin: number; sign: 1 | -1 }[] };

export type Plan = {
  /** Where step 0 of `natural` starts: rows there are added to the step their time falls in, counted from here. */
  origin: number;
  natural: Pieces;
  /** The edges: each summed once and added to or taken from the steps it names. */
  regions: Region[];
};

const floorTo = (ms: number, unit: number) => Math.floor(ms / unit) * unit;
const ceilTo = (ms: number, unit: number) => Math.ceil(ms / unit) * unit;

/** One index range scan, priced as this many rows (the descent and the lateral loop around it). */
const PER_RANGE = 4;
/**
 * A region's row costs about twice a natural piece's: it is summed per region and then again per step, and its
 * range scans run in one process, where a plain range may get parallel workers (measured at 2,000 keys: the Tokens
 * page's 24 hours read 1.65× slower per row as regions).
 */
const REGION_WEIGHT = 2;

function cost(level: ReadLevel, [lo, hi]: Span, density: Density): number {
  // A prefix is one row per caller of its day, whatever its length: as many as the day's row.
  if (level === 'prefix') return 24 * density.day + PER_RANGE;
  // Quarter hours are not in the statistics read: at most the minutes' rows, at most four hours' worth.
  const perHour = level === 'quarter' ? Math.min(density.minute, 4 * density.hour) : density[level];
  return ((hi - lo) / HOUR_MS) * perHour + PER_RANGE;
}

export function planCost(plan: Plan, density: Density): number {
  let sum = 0;
  for (const level of ['minute', 'hour', 'day'] as const) {
    for (const span of plan.natural[level]) sum += cost(level, span, density);
  }
  for (const r of plan.regions) sum += REGION_WEIGHT * cost(r.level, r.span, density);
  return sum;
}

/**
 * The cheapest exact plan for the steps [from + i·step, from + (i+1)·step) up to `to` (read as the end of its
 * minute): planPieces' (every piece inside one step), or one that moves every step's start to the nearest (or the
 * previous, or the next) midnight or hour and reads the difference at the edges. `horizons`: no plan reads rows
 * pruned there.
 */
export function planSteps(
  fromMs: number,
  toMs: number,
  stepMs: number,
  density: Density = DEFAULT_DENSITY,
  horizons?: Horizons,
): Plan {
  const end = ceilTo(toMs, MINUTE_MS);
  let best: Plan = { origin: fromMs, natural: planPieces(fromMs, toMs, stepMs, horizons), regions: [] };
  let bestCost = planCost(best, density);
  const count = Math.ceil((end - fromMs) / stepMs);
  for (const unit of [DAY_MS, HOUR_MS]) {
    // Every start moves by the same amount only when the step is whole units (or there is one step).
    if (count > 1 && stepMs % unit !== 0) continue;
    const offset = fromMs - floorTo(fromMs, unit);
    if (offset === 0 && end % unit === 0) continue;
    for (const shift of new Set([-offset, offset === 0 ? 0 : unit - offset])) {
      const plan = anchored(fromMs, end, stepMs, count, unit, shift, density);
      if (!plan || (horizons && readsPruned(plan, horizons))) continue;
      const c = planCost(plan, density);
      if (c < bestCost) {
        best = plan;
        bestCost = c;
      }
    }
  }
  return best;
}

/** Step starts moved by `shift` (a multiple of a minute that lands on a `unit`), the last end to a unit near it. */
function anchored(
  fromMs: number,
  end: number,
  stepMs: number,
  count: number,
  unit: number,
  shift: number,
  density: Density,
): Plan | null {
  const start = (i: number) => fromMs + i * stepMs;
  const anchor = (i: number) => start(i) + shift;
  // The last step's end: to a unit on either side, kept within one step of the last start (the middle's last step
  // must neither run backwards nor spill into a step that does not exist).
  const lastLo = anchor(count - 1);
  const ends = [floorTo(end, unit), ceilTo(end, unit)].map((a) => Math.min(Math.max(a, lastLo), lastLo + stepMs));
  const endAnchor = ends.reduce((a, b) => (Math.abs(b - end) < Math.abs(a - end) ? b : a));
  const a0 = anchor(0);
  const natural = planPieces(a0, endAnchor, stepMs);
  const regions: Region[] = [];
  const edge = (x: number, a: number, i: number) => {
    if (a === x) return;
    // [a, x) belongs to step i−1 and was counted in step i's middle (a < x); or the other way round (a > x).
    const sign = a < x ? 1 : -1;
    const to: Region['to'] = [];
    if (i >= 1) to.push({ bin: i - 1, sign: sign as 1 | -1 });
    if (i <= count - 1) to.push({ bin: i, sign: -sign as 1 | -1 });
    for (const term of rangeTerms(Math.min(a, x), Math.max(a, x), density)) {
      regions.push({
        level: term.level,
        span: term.span,
        to: to.map((t) => ({ bin: t.bin, sign: (t.sign * term.sign) as 1 | -1 })),
      });
    }
  };
  for (let i = 0; i < count; i++) edge(start(i), anchor(i), i);
  edge(end, endAnchor, count);
  return { origin: a0, natural, regions };
}

type Term = { level: ReadLevel; span: Span; sign: 1 | -1 };

/**
 * The sum over [lo, hi) as signed pieces, the cheapest of: the days, hours and minutes inside it; or with either
 * end moved to its hour (before or after) and the minutes between taken away or added. Within one day, whole hours
 * from midnight are also its prefix, and whole hours up to the next midnight the day less its prefix.
 */
function rangeTerms(lo: number, hi: number, density: Density): Term[] {
  let best: Term[] | null = null;
  let bestCost = Number.POSITIVE_INFINITY;
  const ends = (x: number) => [...new Set([x, floorTo(x, HOUR_MS), ceilTo(x, HOUR_MS)])];
  for (const l of ends(lo)) {
    for (const h of ends(hi)) {
      if (h < l) continue;
      for (const middle of middles(l, h)) {
        const terms = [...middle];
        // [lo, hi) = [l, h) − [l, lo) + [h, hi), each signed.
        if (l !== lo) terms.push({ level: 'minute', span: [Math.min(l, lo), Math.max(l, lo)], sign: l < lo ? -1 : 1 });
        if (h !== hi) terms.push({ level: 'minute', span: [Math.min(h, hi), Math.max(h, hi)], sign: h < hi ? 1 : -1 });
        const read = terms.flatMap((t) => (t.level === 'minute' ? minuteTerms(t, density) : [t]));
        const c = read.reduce((sum, t) => sum + cost(t.level, t.span, density), 0);
        if (c < bestCost) {
          best = read;
          bestCost = c;
        }
      }
    }
  }
  return best ?? [];
}

/**
 * A signed range of minutes, the cheaper of: the minutes; or the quarter hours from either end's quarter (before or
 * after it) and the minutes between taken away or added.
 */
function minuteTerms(term: Term, density: Density): Term[] {
  const [lo, hi] = term.span;
  const q = QUARTER.ms;
  let best: Term[] = [term];
  let bestCost = cost('minute', term.span, density);
  for (const a of new Set([floorTo(lo, q), ceilTo(lo, q)])) {
    for (const b of new Set([floorTo(hi, q), ceilTo(hi, q)])) {
      if (b <= a) continue;
      const terms: Term[] = [{ level: 'quarter', span: [a, b], sign: term.sign }];
      // [lo, hi) = [a, b) − [a, lo) + [b, hi), each signed.
      if (a !== lo) {
        const sign = (a < lo ? -term.sign : term.sign) as 1 | -1;
        terms.push({ level: 'minute', span: [Math.min(a, lo), Math.max(a, lo)], sign });
      }
      if (b !== hi) {
        const sign = (b < hi ? term.sign : -term.sign) as 1 | -1;
        terms.push({ level: 'minute', span: [Math.min(b, hi), Math.max(b, hi)], sign });
      }
      const c = terms.reduce((sum, t) => sum + cost(t.level, t.span, density), 0);
      if (c < bestCost) {
        best = terms;
        bestCost = c;
      }
    }
  }
  return best;
}

/** Ways to read [l, h): its days, hours and minutes; and where it lies in one day from or to a midnight, prefixes. */
function middles(l: number, h: number): Term[][] {
  const pieces = planPieces(l, h, Number.POSITIVE_INFINITY);
  const plain: Term[] = [];
  for (const level of ['day', 'hour', 'minute'] as const) {
    for (const span of pieces[level]) plain.push({ level, span, sign: 1 });
  }
  const out = [plain];
  const withinADay = h - l > 0 && h - l < DAY_MS;
  // [midnight, 10:00): the prefix itself.
  if (withinADay && l % DAY_MS === 0 && h % HOUR_MS === 0) out.push([{ level: 'prefix', span: [l, h], sign: 1 }]);
  // [10:00, next midnight): the day less its prefix to 10:00.
  if (withinADay && h % DAY_MS === 0 && l % HOUR_MS === 0) {
    out.push([
      { level: 'day', span: [h - DAY_MS, h], sign: 1 },
      { level: 'prefix', span: [h - DAY_MS, l], sign: -1 },
    ]);
  }
  return out;
}

function readsPruned(plan: Plan, horizons: Horizons): boolean {
  // Prefixes are pruned with the hours they sum.
  const early = (level: ReadLevel, [lo]: Span) =>
    ((level === 'minute' || level === 'quarter') && lo < horizons.minutesFrom) ||
    ((level === 'hour' || level === 'prefix') && lo < horizons.hoursFrom);
  for (const level of ['minute', 'hour'] as const) {
    if (plan.natural[level].some((s) => early(level, s))) return true;
  }
  return plan.regions.some((r) => early(r.level, r.span));
}

/** Rows per hour of time at each level, from the planner's statistics and each table's first and last time. */
export function densityOf(stats: { level: Level; rows: number; first: Date | null; last: Date | null }[]): Density {
  const out = { ...DEFAULT_DENSITY };
  for (const { level, rows, first, last } of stats) {
    if (!(rows > 0) || !first || !last) return DEFAULT_DENSITY;
    const hours = (last.getTime() - first.getTime() + LEVELS[level].ms) / HOUR_MS;
    out[level] = rows / hours;
  }
  return out;
}

/**
 * The regions of one level that match `where`, each summed once (`sums`, over the level's rows: "sums AS names"
 * and the histogram as buckets) and then added to or taken from the steps it names: a relation of (bin, key…,
 * the same names), `key` grouping as well as the bin ('"tokenId"' for the Tokens page). One index range scan per
 * region, as fromSpans does (OFFSET 0 keeps PostgreSQL from turning them into one scan tested against every
 * region).
 */
export function regionSums(
  level: ReadLevel,
  regions: readonly Region[],
  where: readonly Prisma.Sql[],
  sums: { columns: readonly string[]; select: Prisma.Sql },
  key: readonly string[] = [],
): Prisma.Sql {
  const { table, at } = tableOf(level);
  const iso = (ms: number) => new Date(ms).toISOString();
  const name = Prisma.raw(`"${table}"`);
  const time = Prisma.raw(`"${at}"`);
  const also = where.length ? Prisma.sql`AND ${Prisma.join(where, ' AND ')}` : Prisma.empty;
  // A prefix region is one (day, until) of UsageDayPrefix: an equality on its unique index's first two columns.
  const within =
    level === 'prefix' ? Prisma.sql`${time} = s.lo AND until = s.hi` : Prisma.sql`${time} >= s.lo AND ${time} < s.hi`;
  const to = regions.flatMap((r, id) => r.to.map((t) => ({ id, ...t })));
  const keys = key.length ? Prisma.raw(`${key.map((k) => `r.${k}`).join(', ')}, `) : Prisma.empty;
  const inner = key.length ? Prisma.raw(`, ${key.join(', ')}`) : Prisma.empty;
  const signed = Prisma.raw(sums.columns.map((c) => `sum(e.sign * r."${c}") AS "${c}"`).join(', '));
  const buckets = USAGE_BUCKETS_MS.map((_, i) => `sum(e.sign * r.buckets[${i + 1}])`).join(', ');
  return Prisma.sql`
    SELECT e.bin, ${keys}${signed}, ARRAY[${Prisma.raw(buckets)}]::float8[] AS buckets
    FROM (
      SELECT s.id${inner}, ${sums.select}
      FROM unnest(${regions.map((r) => iso(r.span[0]))}::timestamp[], ${regions.map((r) => iso(r.span[1]))}::timestamp[],
          ${regions.map((_, id) => id)}::int[]) AS s(lo, hi, id)
        CROSS JOIN LATERAL (
          SELECT * FROM ${name} WHERE ${within} ${also} OFFSET 0
        ) AS ${name}
      GROUP BY s.id${inner}
    ) r
    JOIN unnest(${to.map((t) => t.id)}::int[], ${to.map((t) => t.bin)}::int[], ${to.map((t) => t.sign)}::int[])
      AS e(id, bin, sign) ON e.id = r.id
    GROUP BY e.bin${key.length ? Prisma.raw(`, ${key.map((k) => `r.${k}`).join(', ')}`) : Prisma.empty}`;
}
