import type { Logger } from '@hangar/common/log';
import { tokenIdsOfUserSql } from '../access/access-store.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import { seenByOwnersSql } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { USAGE_BUCKETS_MS } from './usage.js';
import {
  type Density,
  densityOf,
  type Plan,
  planSteps,
  type ReadLevel,
  type Region,
  regionSums,
  tableOf,
} from './usage-plan.js';
import { UsagePruner } from './usage-retention.js';
import {
  DEFAULT_USAGE_RETENTION,
  horizonsAt,
  parseUsageRetention,
  type UsageRetention,
} from './usage-retention-setting.js';
import { fromSpans, type Horizons, LEVELS, type Level, type Span, utc } from './usage-rollup.js';

/** The longest range one query reads: usage is kept per minute, and a month of it is what a chart compares. */
export const USAGE_MAX_DAYS = 31;
/** Steps past a day read as one point per day at most; longer steps would hide the month they summarize. */
export const USAGE_MAX_STEP_MINUTES = 1440;
/** Points in one answer: a day at one-minute steps; a longer range takes a longer step. */
export const USAGE_MAX_POINTS = 1440;

const MINUTE_MS = 60_000;
const HOUR_MS = 60 * MINUTE_MS;
const DAY_MS = 24 * HOUR_MS;

export type UsageTotals = {
  requests: number;
  errors: number;
  aborted: number;
  promptTokens: number;
  completionTokens: number;
  /** Of promptTokens, those replicas reused from their prompt caches. */
  cachedTokens: number;
  /** Completion tokens over the seconds the range (or the step) covers. */
  tokensPerSecond: number;
  p50Ms: number | null;
  p95Ms: number | null;
  meanTtftMs: number | null;
};

export type UsagePoint = UsageTotals & { at: Date };

export type Usage = {
  from: Date;
  to: Date;
  stepMinutes: number;
  points: UsagePoint[];
  totals: UsageTotals;
  /** The filter and owners it was read with, for fields that read the same rows again (Usage.cost). */
  asked?: { filter: UsageFilter; owners?: string[] };
};

export type UsageFilter = {
  model?: string | null;
  /** '' is the base model alone (requests that named no adapter); absent is every adapter and the base. */
  adapter?: string | null;
  /** A replica's id (the x-hangar-replica header of its answers): where a model's conversations went. */
  replica?: string | null;
  /** An API token's id; '' is the console's sessions (the playground). */
  token?: string | null;
  from: Date;
  to: Date;
  /** Minutes per point; 1 when absent. */
  step?: number | null;
};

/** One step's sums as PostgreSQL adds them up; the histogram's buckets summed index by index. */
type Row = {
  bin: number;
  requests: number;
  errors: number;
  aborted: number;
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
  ttftMsSum: number;
  ttftCount: number;
  buckets: number[] | null;
};

type Sums = Omit<Row, 'bin' | 'buckets'> & { buckets: number[] };

export type UsageServiceDeps = {
  db: Db;
  /** HANGAR_USAGE_RETENTION: how long minutes, hours and days are kept (usage-retention.ts); its default if absent. */
  retention?: UsageRetention;
  /** Where the pruning loop says what it did; none: it says nothing. */
  log?: Logger;
  /**
   * Rows per hour each level holds, which decides how a query is read (usage-plan.ts); absent: estimated from the
   * tables' statistics. Every way gives the same answer: tests set it to make one of them happen.
   */
  density?: Density;
};

/**
 * Reads the usage the gateway records per minute (UsageMinute) and its rollups per hour and per day (UsageHour,
 * UsageDay: usage-rollup.ts), summed per step in PostgreSQL from the coarsest rows that make up each step exactly.
 * Who asks decides what is read: OPERATOR and above read every caller's; a VIEWER reads their own tokens' and
 * sessions' alone, and a filter for someone else's token reads as no usage at all, so a token id reveals nothing
 * about its owner.
 */
export class UsageService {
  /** Deletes what is past the retention (started and stopped with the server, app.ts). */
  readonly pruner: UsagePruner;
  private readonly db: Db;
  private readonly retention: UsageRetention;
  private readonly fixedDensity: Density | undefined;
  private densityCache: { at: number; density: Density } | undefined;

  constructor(deps: UsageServiceDeps) {
    this.db = deps.db;
    this.fixedDensity = deps.density;
    this.retention = deps.retention ?? (parseUsageRetention(DEFAULT_USAGE_RETENTION) as UsageRetention);
    this.pruner = new UsagePruner({ db: deps.db, retention: this.retention, log: deps.log ?? silent });
  }

  /** From when minutes and hours are still kept, now. */
  horizons(): Horizons {
    return horizonsAt(this.retention, this.db.clock.nowMs());
  }

  /**
   * For reads that need the minutes themselves (the cost report divides each minute's GPU time among its calls):
   * refuses a range that starts before the minutes still kept, saying from when they are.
   */
  minutesKept(from: Date): Result<void> {
    const { minutesFrom } = this.horizons();
    if (from.getTime() >= minutesFrom) return ok(undefined);
    return fail(
      new ValidationError(
        'from',
        `usage per minute is kept from ${new Date(minutesFrom).toISOString()} on (HANGAR_USAGE_RETENTION); from ${from.toISOString()} is earlier: ask from then on, or keep minutes longer`,
      ),
    );
  }

  /**
   * `owners` (org-owners.ts seenOwners): usage of an owned model or adapter is read only by those its owner admits
   * (absent: an admin, all), so asking for a team's adapter by name reads as asking for one never called.
   */
  async usage(viewer: Viewer, filter: UsageFilter, owners?: string[]): Promise<Result<Usage>> {
    const range = checkRange(filter, this.horizons());
    if (!range.ok) return range;
    const { from, to, stepMinutes } = range.value;
    const stepMs = stepMinutes * MINUTE_MS;
    const count = Math.ceil((to.getTime() - from.getTime()) / stepMs);
    // Every row's step is one of the points (the plan counts none outside them); checked, not trusted.
    const rows = (await this.sums(viewer, filter, from, to, stepMs, owners)).filter((r) => r.bin >= 0 && r.bin < count);
    const sums = new Array<Sums | undefined>(count);
    for (const r of rows) sums[r.bin] = sumsOf(r);
    const points: UsagePoint[] = new Array(count);
    // Every step is a point, zeros where nothing was recorded: a chart drawn from it has no gaps to guess over. (The
    // zeros are described once: a day by minute is mostly empty minutes.)
    const zero = describe(empty(), stepMs);
    for (let i = 0; i < count; i++) {
      const s = sums[i];
      points[i] = { at: new Date(from.getTime() + i * stepMs), ...(s ? describe(s, stepMs) : zero) };
    }
    const all = sums.reduce<Sums>((a, b) => (b ? add(a, b) : a), empty());
    return ok({ from, to, stepMinutes, points, totals: describe(all, to.getTime() - from.getTime()) });
  }

  /**
   * Totals per token over one range, in one query for all of them (the Tokens page asks for every row at once).
   * The viewer's restriction applies as in usage(): another user's token reads as zeros.
   */
  async totalsByToken(
    viewer: Viewer,
    tokenIds: readonly string[],
    fromIn: Date,
    toIn: Date,
  ): Promise<Result<Map<string, UsageTotals>>> {
    // Totals have no steps: the 31 days a token's usage is documented to cover are one sum, not 44,640 points.
    const range = checkSpan({ from: fromIn, to: toIn }, this.horizons());
    if (!range.ok) return range;
    const { from, to } = range.value;
    const ids = [...new Set(tokenIds)];
    // One step, the whole range (a step longer than any range: its end may move to either side), read as usage()
    // reads a step (usage-plan.ts), each level summed per token.
    const plan = planSteps(
      from.getTime(),
      to.getTime(),
      (USAGE_MAX_DAYS + 1) * DAY_MS,
      await this.density(),
      this.horizons(),
    );
    const where = [Prisma.sql`"tokenId" IN (${Prisma.join(ids.length ? ids : [''])})`, this.restriction(viewer)];
    const natural = levelsOf(plan.natural).map(
      ([level, spans]) => Prisma.sql`
          SELECT "tokenId", ${this.sumColumns()}, ${histogramSum()} AS buckets
          FROM ${fromSpans(level, spans, where)}
          GROUP BY "tokenId"`,
    );
    const regions = regionLevels(plan).map(
      ([level, regions]) => Prisma.sql`
          SELECT "tokenId", ${SUM_NAMES}, g.buckets
          FROM (${regionSums(level, regions, where, { columns: SUM_COLUMNS, select: this.regionColumns() }, ['"tokenId"'])}) g`,
    );
    const parts = [...natural, ...regions];
    const rows =
      ids.length && parts.length
        ? await this.rows<Omit<Row, 'bin'> & { tokenId: string }>(Prisma.sql`
          SELECT "tokenId", ${this.sumColumns()}, ${histogramSum('buckets')} AS buckets
          FROM (${Prisma.join(parts, ' UNION ALL ')}) l GROUP BY "tokenId"`)
        : [];
    const byToken = new Map(rows.map((r) => [r.tokenId, r]));
    const span = to.getTime() - from.getTime();
    return ok(
      new Map(
        ids.map((id) => {
          const row = byToken.get(id);
          return [id, describe(row ? sumsOf(row) : empty(), span)];
        }),
      ),
    );
  }

  /**
   * What the cost report prices (governance/cost.service.ts), as SQL its one query selects from: the rows `viewer`
   * may read of [from, to) (minute-aligned), by caller, model, node, replica and minute. Columns "tokenId",
   * "userId", model, node, "replicaId", m (the minute, epoch ms), r, p, c (requests, prompt and completion
   * tokens, numeric). The gateway owns the table; this is its read, composed there rather than copied.
   */
  rowsForCost(
    viewer: Viewer,
    filter: Pick<UsageFilter, 'model' | 'adapter' | 'replica' | 'token'> & { from: Date; to: Date },
    owners?: string[],
  ) {
    // Hangar's own reads (the prices a spend budget uses, pricing.ts) read every caller's rows.
    const who = viewer.kind === 'system' ? Prisma.sql`TRUE` : this.restriction(viewer);
    const where = [this.window(filter.from, filter.to), who];
    if (owners) where.push(seenOnly(owners));
    if (filter.model != null) where.push(Prisma.sql`"model" = ${filter.model}`);
    if (filter.adapter != null) where.push(Prisma.sql`"adapter" = ${filter.adapter}`);
    if (filter.replica != null) where.push(Prisma.sql`"replicaId" = ${filter.replica}`);
    if (filter.token != null) where.push(Prisma.sql`"tokenId" = ${filter.token}`);
    return Prisma.sql`
      SELECT "tokenId", "userId", model, node, "replicaId", (extract(epoch FROM minute) * 1000)::numeric AS m,
        sum(requests)::numeric AS r, sum("promptTokens")::numeric AS p, sum("completionTokens")::numeric AS c
      FROM "UsageMinute" WHERE ${Prisma.join(where, ' AND ')}
      GROUP BY "tokenId", "userId", model, node, "replicaId", minute`;
  }

  /**
   * One aggregate over the range, grouped by step: never a row per minute sent back to be added up here, and one
   * pass over the rows whatever the number of steps (the histogram is summed bucket by bucket in the same GROUP BY).
   */
  private async sums(
    viewer: Viewer,
    filter: UsageFilter,
    from: Date,
    to: Date,
    stepMs: number,
    owners?: string[],
  ): Promise<Row[]> {
    // Steps are counted from `from` (its minute), so the first point starts where the range does. The plan
    // (usage-plan.ts) reads whole days and hours from the rollups and the rest from the minutes: either each step's
    // own days, hours and edge minutes, or, where steps start off midnight or the hour, the days or hours from a
    // moved start with the edges between read once and added to one step and taken from the next.
    const plan = planSteps(from.getTime(), to.getTime(), stepMs, await this.density(), this.horizons());
    const where = (level: ReadLevel) => {
      const out = [this.restriction(viewer)];
      if (owners) out.push(seenOnly(owners, level));
      if (filter.model != null) out.push(Prisma.sql`"model" = ${filter.model}`);
      if (filter.adapter != null) out.push(Prisma.sql`"adapter" = ${filter.adapter}`);
      if (filter.replica != null) out.push(Prisma.sql`"replicaId" = ${filter.replica}`);
      if (filter.token != null) out.push(Prisma.sql`"tokenId" = ${filter.token}`);
      return out;
    };
    // Rows in the plan's natural pieces go to the step their time falls in, counted from the plan's origin: grouped
    // by date_bin (timestamp arithmetic, cheap per row), the step's number worked out once per group.
    const stepMinutes = Math.round(stepMs / MINUTE_MS);
    const natural = levelsOf(plan.natural).map(([level, spans]) => {
      const at = Prisma.raw(`"${LEVELS[level].at}"`);
      return Prisma.sql`
        SELECT floor((extract(epoch FROM g.at) * 1000 - ${plan.origin}) / ${stepMs})::int AS bin, ${SUM_NAMES}, g.buckets
        FROM (
          SELECT date_bin(make_interval(mins => ${stepMinutes}::int), ${at}, ${utc(plan.origin)}) AS at,
            ${this.sumColumns()}, ${histogramSum()} AS buckets
          FROM ${fromSpans(level, spans, where(level))}
          GROUP BY 1
        ) g`;
    });
    const regions = regionLevels(plan).map(([level, regions]) =>
      regionSums(level, regions, where(level), { columns: SUM_COLUMNS, select: this.regionColumns() }),
    );
    const parts = [...natural, ...regions];
    if (!parts.length) return [];
    // One level read plainly (a day by minute, a month by day from midnight) has one row per step already: adding
    // them up again would cost a second aggregate over every step.
    if (natural.length === 1 && !regions.length) {
      return this.rows<Row>(Prisma.sql`SELECT * FROM (${natural[0]}) l`);
    }
    return this.rows<Row>(Prisma.sql`
      SELECT bin, ${this.sumColumns()}, ${histogramSum('buckets')} AS buckets
      FROM (${Prisma.join(parts, ' UNION ALL ')}) l
      GROUP BY bin`);
  }

  /**
   * The rows of `query` as one JSON text, parsed here: a day by minute is up to 1,440 rows of 9 numbers and a
   * histogram, which Prisma's raw path would convert cell by cell (one text cell instead cut Node's CPU for it by
   * about a third, measured side by side). float8 prints as the shortest text that reads back to the same double
   * (PostgreSQL's default extra_float_digits), so the numbers arrive exactly as they were summed.
   */
  private async rows<T>(query: Prisma.Sql): Promise<T[]> {
    const [out] = await this.db.$queryRaw<{ rows: string }[]>`
      SELECT coalesce(json_agg(q), '[]')::text AS rows FROM (${query}) q`;
    return JSON.parse(out?.rows ?? '[]') as T[];
  }

  /** Rows per hour each level holds (the planner's statistics), read again at most once a minute. */
  private async density(): Promise<Density> {
    if (this.fixedDensity) return this.fixedDensity;
    const now = performance.now();
    if (this.densityCache && now - this.densityCache.at < 60_000) return this.densityCache.density;
    const stats = await this.db.$queryRaw<{ level: Level; rows: number; first: Date | null; last: Date | null }[]>`
      ${Prisma.join(
        (['minute', 'hour', 'day'] as const).map((level) => {
          const { table, at } = LEVELS[level];
          return Prisma.sql`SELECT ${level}::text AS level,
            (SELECT reltuples FROM pg_class WHERE oid = ${`"${table}"`}::regclass)::float8 AS rows,
            (SELECT min(${Prisma.raw(`"${at}"`)}) FROM ${Prisma.raw(`"${table}"`)}) AS first,
            (SELECT max(${Prisma.raw(`"${at}"`)}) FROM ${Prisma.raw(`"${table}"`)}) AS last`;
        }),
        ' UNION ALL ',
      )}`;
    const density = densityOf(stats);
    this.densityCache = { at: now, density };
    return density;
  }

  /** The per-region sums regionSums takes: as sumColumns, and the histogram as buckets. */
  private regionColumns() {
    return Prisma.sql`${this.sumColumns()}, ${histogramSum()} AS buckets`;
  }

  // Sums as float8: JSON numbers, exact to 2^53 tokens, where bigint would arrive as BigInt. Each value is cast
  // before it is added: a sum of bigint is numeric, several times slower to add than float8 (the rollups are bigint).
  private sumColumns() {
    return Prisma.raw(SUM_COLUMNS.map((c) => `sum("${c}"::float8) AS "${c}"`).join(', '));
  }

  // "minute" is a UTC timestamp without a zone: the bounds are made the same way, whatever the session's zone.
  private window(from: Date, to: Date) {
    return Prisma.sql`"minute" >= (to_timestamp(${from.getTime() / 1000}) AT TIME ZONE 'UTC')
      AND "minute" < (to_timestamp(${to.getTime() / 1000}) AT TIME ZONE 'UTC')`;
  }

  /** What the viewer may read: everything from OPERATOR up; a VIEWER (or anyone else) only their own usage. */
  private restriction(viewer: Viewer) {
    if ((viewer.kind === 'user' || viewer.kind === 'token') && roleAtLeast(viewer.role, 'OPERATOR')) {
      return Prisma.sql`TRUE`;
    }
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return Prisma.sql`FALSE`;
    const me = viewer.user.id;
    // Rows carry the token's user; the token list is asked too, so the restriction holds whoever wrote the row.
    return Prisma.sql`("userId" = ${me} OR ("tokenId" <> '' AND "tokenId" IN (${tokenIdsOfUserSql(me)})))`;
  }
}

/**
 * from < to and at most 31 days apart; from moved to the start of its minute. Where the range reaches back past the
 * minutes still kept (`kept`, HANGAR_USAGE_RETENTION), its ends there move out to their hour (past the hours kept,
 * their day): the grain usage is kept at then.
 */
function checkSpan(filter: Pick<UsageFilter, 'from' | 'to'>, kept?: Horizons): Result<{ from: Date; to: Date }> {
  // The range starts at its minute: usage is kept per minute, and a step must not straddle two of them.
  let fromMs = Math.floor(filter.from.getTime() / MINUTE_MS) * MINUTE_MS;
  let toMs = filter.to.getTime();
  if (kept) {
    if (fromMs < kept.minutesFrom) fromMs = Math.floor(fromMs / HOUR_MS) * HOUR_MS;
    if (fromMs < kept.hoursFrom) fromMs = Math.floor(fromMs / DAY_MS) * DAY_MS;
    if (toMs < kept.minutesFrom) toMs = Math.ceil(toMs / HOUR_MS) * HOUR_MS;
    if (toMs < kept.hoursFrom) toMs = Math.ceil(toMs / DAY_MS) * DAY_MS;
  }
  const from = new Date(fromMs);
  const to = toMs === filter.to.getTime() ? filter.to : new Date(toMs);
  if (!(to.getTime() > filter.from.getTime())) {
    return fail(
      new ValidationError(
        'to',
        `to must be after from: ${to.toISOString()} is not after ${filter.from.toISOString()}; swap them or move to later`,
      ),
    );
  }
  const spanMs = to.getTime() - from.getTime();
  if (spanMs > USAGE_MAX_DAYS * DAY_MS) {
    return fail(
      new ValidationError(
        'from',
        `from is ${(spanMs / DAY_MS).toFixed(1)} days before to; at most ${USAGE_MAX_DAYS}: ask for a shorter range, or for several`,
      ),
    );
  }
  return ok({ from, to });
}

/**
 * A span checkSpan accepts, and a step that gives at most USAGE_MAX_POINTS points; over a range reaching back past
 * the minutes kept, a step of whole hours (past the hours kept, of a day).
 */
function checkRange(filter: Pick<UsageFilter, 'from' | 'to' | 'step'>, kept: Horizons) {
  const span = checkSpan(filter, kept);
  if (!span.ok) return span;
  const { from, to } = span.value;
  const spanMs = to.getTime() - from.getTime();
  const stepMinutes = filter.step ?? 1;
  if (!Number.isInteger(stepMinutes) || stepMinutes < 1 || stepMinutes > USAGE_MAX_STEP_MINUTES) {
    return fail(
      new ValidationError(
        'step',
        `step is whole minutes from 1 to ${USAGE_MAX_STEP_MINUTES} (a day): ${filter.step} is not accepted`,
      ),
    );
  }
  const coarser = from.getTime() < kept.hoursFrom ? 1440 : from.getTime() < kept.minutesFrom ? 60 : 1;
  if (stepMinutes % coarser !== 0) {
    const grain = coarser === 60 ? 'hour' : 'day';
    const since = new Date(coarser === 60 ? kept.minutesFrom : kept.hoursFrom).toISOString();
    return fail(
      new ValidationError(
        'step',
        `before ${since} usage is kept per ${grain} (HANGAR_USAGE_RETENTION): a step of ${stepMinutes} minutes splits its ${grain}s; use a step of ${coarser === 60 ? 'whole hours (60, 120, … minutes)' : '1440 minutes'}, or a from after ${since}`,
      ),
    );
  }
  const points = Math.ceil(spanMs / (stepMinutes * MINUTE_MS));
  if (points > USAGE_MAX_POINTS) {
    const least = Math.ceil(spanMs / MINUTE_MS / USAGE_MAX_POINTS);
    return fail(
      new ValidationError(
        'step',
        `at ${stepMinutes}-minute steps this range is ${points} points; at most ${USAGE_MAX_POINTS}: use a step of ${least} minutes or more`,
      ),
    );
  }
  return ok({ from, to, stepMinutes });
}

function empty(): Sums {
  return {
    requests: 0,
    errors: 0,
    aborted: 0,
    promptTokens: 0,
    completionTokens: 0,
    cachedTokens: 0,
    ttftMsSum: 0,
    ttftCount: 0,
    buckets: [],
  };
}

function sumsOf(row: Omit<Row, 'bin'>): Sums {
  return {
    requests: Number(row.requests),
    errors: Number(row.errors),
    aborted: Number(row.aborted),
    promptTokens: Number(row.promptTokens),
    completionTokens: Number(row.completionTokens),
    cachedTokens: Number(row.cachedTokens ?? 0),
    ttftMsSum: Number(row.ttftMsSum),
    ttftCount: Number(row.ttftCount),
    buckets: (row.buckets ?? []).map(Number),
  };
}

function add(a: Sums, b: Sums): Sums {
  const n = Math.max(a.buckets.length, b.buckets.length);
  const buckets = new Array<number>(n);
  for (let i = 0; i < n; i++) buckets[i] = (a.buckets[i] ?? 0) + (b.buckets[i] ?? 0);
  return {
    requests: a.requests + b.requests,
    errors: a.errors + b.errors,
    aborted: a.aborted + b.aborted,
    promptTokens: a.promptTokens + b.promptTokens,
    completionTokens: a.completionTokens + b.completionTokens,
    cachedTokens: a.cachedTokens + b.cachedTokens,
    ttftMsSum: a.ttftMsSum + b.ttftMsSum,
    ttftCount: a.ttftCount + b.ttftCount,
    buckets,
  };
}

function describe(s: Sums, spanMs: number): UsageTotals {
  return {
    requests: s.requests,
    errors: s.errors,
    aborted: s.aborted,
    promptTokens: s.promptTokens,
    completionTokens: s.completionTokens,
    cachedTokens: s.cachedTokens,
    tokensPerSecond: s.completionTokens / (spanMs / 1000),
    p50Ms: percentileMs(s.buckets, 0.5),
    p95Ms: percentileMs(s.buckets, 0.95),
    meanTtftMs: s.ttftCount > 0 ? s.ttftMsSum / s.ttftCount : null,
  };
}

/**
 * The upper bound of the histogram bucket where the cumulative count reaches the quantile: "p95 ≤ 2500 ms".
 * Past the last finite bound the answer is that bound (120 s): the histogram knows only "longer than that".
 * Null when nothing was counted.
 */
export function percentileMs(buckets: readonly number[], q: number): number | null {
  let total = 0;
  for (const b of buckets) total += b;
  if (total <= 0) return null;
  let seen = 0;
  for (let i = 0; i < buckets.length; i++) {
    seen += buckets[i] ?? 0;
    if (seen >= q * total) {
      const bound = USAGE_BUCKETS_MS[i] ?? Number.POSITIVE_INFINITY;
      return Number.isFinite(bound) ? bound : LAST_FINITE_MS;
    }
  }
  return LAST_FINITE_MS;
}

/** The histogram's last finite bound (120 s). */
const LAST_FINITE_MS = USAGE_BUCKETS_MS.filter(Number.isFinite).at(-1) ?? 0;

/**
 * The latency histograms of a group's rows summed bucket by bucket, as one float8[] of USAGE_BUCKETS_MS.length, in
 * the same pass as the other sums. (It was once a subquery per step over every matching row: a month of usage was
 * read 31 times, a day at one-minute steps 1,440 times.) Every row holds exactly that many buckets: the recorder
 * writes them so and its upsert adds two such arrays index by index (usage.ts). No subquery per row here (one to sum
 * a longer array's extra buckets, say): it would make the statement parallel-restricted, half the speed on 2 cores.
 */
function histogramSum(column = '"durationBuckets"') {
  const cells = USAGE_BUCKETS_MS.map(
    (_, i) => Prisma.sql`sum(coalesce(${Prisma.raw(column)}[${Prisma.raw(String(i + 1))}], 0)::float8)`,
  );
  return Prisma.sql`ARRAY[${Prisma.join(cells, ', ')}]::float8[]`;
}

const table = (level: ReadLevel) => Prisma.raw(`"${tableOf(level).table}"`);

/** The levels that have pieces to read, coarsest first. */
function levelsOf(pieces: Record<Level, Span[]>): [Level, Span[]][] {
  return (['day', 'hour', 'minute'] as const).filter((l) => pieces[l].length).map((l) => [l, pieces[l]]);
}

/** The sums every query returns, as float8 (sumColumns), in this order. */
const SUM_COLUMNS = [
  'requests',
  'errors',
  'aborted',
  'promptTokens',
  'completionTokens',
  'cachedTokens',
  'ttftMsSum',
  'ttftCount',
] as const;
const SUM_NAMES = Prisma.raw(SUM_COLUMNS.map((c) => `g."${c}"`).join(', '));

/** The plan's regions by level, coarsest first. */
function regionLevels(plan: Plan): [ReadLevel, Region[]][] {
  return (['day', 'prefix', 'hour', 'quarter', 'minute'] as const)
    .map((level) => [level, plan.regions.filter((r) => r.level === level)] as [ReadLevel, Region[]])
    .filter(([, regions]) => regions.length);
}

const silent = { debug() {}, info() {}, warn() {}, error() {} } as unknown as Logger;

/**
 * Rows of models and adapters these owners admit, or nobody owns: the catalog's owner filter (catalog-store.ts),
 * in the same statement (no query per row).
 */
function seenOnly(owners: string[], level: ReadLevel = 'minute') {
  return seenByOwnersSql(table(level), owners);
}
