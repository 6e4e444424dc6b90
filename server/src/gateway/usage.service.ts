import { tokenIdsOfUserSql } from '../access/access-store.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import { seenByOwnersSql } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { USAGE_BUCKETS_MS } from './usage.js';

/** The longest range one query reads: usage is kept per minute, and a month of it is what a chart compares. */
export const USAGE_MAX_DAYS = 31;
/** Steps past a day read as one point per day at most; longer steps would hide the month they summarize. */
export const USAGE_MAX_STEP_MINUTES = 1440;
/** Points in one answer: a day at one-minute steps; a longer range takes a longer step. */
export const USAGE_MAX_POINTS = 1440;

const MINUTE_MS = 60_000;
const DAY_MS = 24 * 60 * MINUTE_MS;

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

/**
 * Reads the per-minute usage the gateway records (UsageMinute), summed per step in PostgreSQL. Who asks decides
 * what is read: OPERATOR and above read every caller's; a VIEWER reads their own tokens' and sessions' alone,
 * and a filter for someone else's token reads as no usage at all, so a token id reveals nothing about its owner.
 */
export class UsageService {
  private readonly db: Db;

  constructor(deps: { db: Db }) {
    this.db = deps.db;
  }

  /**
   * `owners` (org-owners.ts seenOwners): usage of an owned model or adapter is read only by those its owner admits
   * (absent: an admin, all), so asking for a team's adapter by name reads as asking for one never called.
   */
  async usage(viewer: Viewer, filter: UsageFilter, owners?: string[]): Promise<Result<Usage>> {
    const range = checkRange(filter);
    if (!range.ok) return range;
    const { from, to, stepMinutes } = range.value;
    const stepMs = stepMinutes * MINUTE_MS;
    const count = Math.ceil((to.getTime() - from.getTime()) / stepMs);
    const rows = await this.sums(viewer, filter, from, to, stepMs, owners);
    const byBin = new Map(rows.map((r) => [r.bin, r]));
    const points: UsagePoint[] = [];
    // Every step is a point, zeros where nothing was recorded: a chart drawn from it has no gaps to guess over.
    for (let i = 0; i < count; i++) {
      const row = byBin.get(i);
      points.push({ at: new Date(from.getTime() + i * stepMs), ...describe(row ? sumsOf(row) : empty(), stepMs) });
    }
    const all = rows.map(sumsOf).reduce(add, empty());
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
    const range = checkSpan({ from: fromIn, to: toIn });
    if (!range.ok) return range;
    const { from, to } = range.value;
    const ids = [...new Set(tokenIds)];
    const rows = ids.length
      ? await this.db.$queryRaw<(Omit<Row, 'bin'> & { tokenId: string })[]>`
          SELECT "tokenId", ${this.sumColumns()}, ${histogramSum()} AS buckets
          FROM "UsageMinute"
          WHERE "tokenId" IN (${Prisma.join(ids)}) AND ${this.window(from, to)} AND ${this.restriction(viewer)}
          GROUP BY "tokenId"`
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
  private sums(
    viewer: Viewer,
    filter: UsageFilter,
    from: Date,
    to: Date,
    stepMs: number,
    owners?: string[],
  ): Promise<Row[]> {
    const where = [this.window(from, to), this.restriction(viewer)];
    if (owners) where.push(seenOnly(owners));
    if (filter.model != null) where.push(Prisma.sql`"model" = ${filter.model}`);
    if (filter.adapter != null) where.push(Prisma.sql`"adapter" = ${filter.adapter}`);
    if (filter.replica != null) where.push(Prisma.sql`"replicaId" = ${filter.replica}`);
    if (filter.token != null) where.push(Prisma.sql`"tokenId" = ${filter.token}`);
    // Steps are counted from `from` (its minute), so the first point starts where the range does. Rows are grouped
    // by date_bin (timestamp arithmetic, cheap per row); the step's number is worked out once per step, outside.
    const origin = Prisma.sql`(to_timestamp(${from.getTime() / 1000}) AT TIME ZONE 'UTC')`;
    const stepMinutes = Math.round(stepMs / MINUTE_MS);
    return this.db.$queryRaw<Row[]>`
      SELECT floor((extract(epoch FROM g.at) * 1000 - ${from.getTime()}) / ${stepMs})::int AS bin, g.*
      FROM (
        SELECT date_bin(make_interval(mins => ${stepMinutes}::int), "minute", ${origin}) AS at,
          ${this.sumColumns()}, ${histogramSum()} AS buckets
        FROM "UsageMinute" WHERE ${Prisma.join(where, ' AND ')}
        GROUP BY 1
      ) g ORDER BY 1`;
  }

  // Sums as float8: JSON numbers, exact to 2^53 tokens, where bigint would arrive as BigInt.
  private sumColumns() {
    return Prisma.sql`sum("requests")::float8 AS "requests", sum("errors")::float8 AS "errors",
      sum("aborted")::float8 AS "aborted", sum("promptTokens")::float8 AS "promptTokens",
      sum("completionTokens")::float8 AS "completionTokens", sum("cachedTokens")::float8 AS "cachedTokens",
      sum("ttftMsSum")::float8 AS "ttftMsSum",
      sum("ttftCount")::float8 AS "ttftCount"`;
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

/** from < to and at most 31 days apart; from moved to the start of its minute. */
function checkSpan(filter: Pick<UsageFilter, 'from' | 'to'>): Result<{ from: Date; to: Date }> {
  // The range starts at its minute: usage is kept per minute, and a step must not straddle two of them.
  const from = new Date(Math.floor(filter.from.getTime() / MINUTE_MS) * MINUTE_MS);
  const to = filter.to;
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

/** A span checkSpan accepts, and a step that gives at most USAGE_MAX_POINTS points. */
function checkRange(filter: Pick<UsageFilter, 'from' | 'to' | 'step'>) {
  const span = checkSpan(filter);
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
  const buckets = Array.from({ length: Math.max(a.buckets.length, b.buckets.length) }, (_, i) => {
    return (a.buckets[i] ?? 0) + (b.buckets[i] ?? 0);
  });
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
  const total = buckets.reduce((a, b) => a + b, 0);
  if (total <= 0) return null;
  const lastFinite = USAGE_BUCKETS_MS.filter(Number.isFinite).at(-1) ?? 0;
  let seen = 0;
  for (let i = 0; i < buckets.length; i++) {
    seen += buckets[i] ?? 0;
    if (seen >= q * total) {
      const bound = USAGE_BUCKETS_MS[i] ?? Number.POSITIVE_INFINITY;
      return Number.isFinite(bound) ? bound : lastFinite;
    }
  }
  return lastFinite;
}

/**
 * The latency histograms of a group's rows summed bucket by bucket, as one float8[] of USAGE_BUCKETS_MS.length, in
 * the same pass as the other sums. (It was once a subquery per step over every matching row: a month of usage was
 * read 31 times, a day at one-minute steps 1,440 times.) Every row holds exactly that many buckets: the recorder
 * writes them so and its upsert adds two such arrays index by index (usage.ts). No subquery per row here (one to sum
 * a longer array's extra buckets, say): it would make the statement parallel-restricted, half the speed on 2 cores.
 */
function histogramSum() {
  const cells = USAGE_BUCKETS_MS.map(
    (_, i) => Prisma.sql`sum(coalesce("durationBuckets"[${Prisma.raw(String(i + 1))}], 0))`,
  );
  return Prisma.sql`ARRAY[${Prisma.join(cells, ', ')}]::float8[]`;
}

/**
 * Rows of models and adapters these owners admit, or nobody owns: the catalog's owner filter (catalog-store.ts),
 * in the same statement (no query per row).
 */
function seenOnly(owners: string[]) {
  return seenByOwnersSql(Prisma.sql`"UsageMinute"`, owners);
}
