import type { Logger } from '@hangar/common/log';
import type { Db } from '../db/client.js';

// Every request the gateway answers is accounted, but never with a database round-trip on its own path: the
// recorder adds it to a row in memory (one per minute, caller token, model, adapter and replica) and writes
// what gathered once a second, adding to the rows already there (several server replicas write the same
// minute). The same write moves each model's last request, from which an on-demand model's idle time counts.
// When the database is away the rows wait in memory and go with the next write that gets through: their
// number is bounded by the distinct keys of the minutes it was away, not by the requests.

/** Upper bounds (ms) of the latency histogram kept per usage row; the last is "longer than 120 s". */
export const USAGE_BUCKETS_MS = [50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 120_000, Infinity];

export type Outcome = 'ok' | 'error' | 'aborted';

export type UsageEvent = {
  at: Date;
  tokenId: string;
  userId: string;
  model: string;
  adapter: string;
  node: string;
  replicaId: string;
  outcome: Outcome;
  promptTokens: number;
  completionTokens: number;
  ttftMs: number | null;
  durationMs: number;
};

type Row = {
  minute: Date;
  tokenId: string;
  userId: string;
  model: string;
  adapter: string;
  node: string;
  replicaId: string;
  requests: number;
  errors: number;
  aborted: number;
  promptTokens: number;
  completionTokens: number;
  ttftMsSum: number;
  ttftCount: number;
  durationMsSum: number;
  buckets: number[];
};

export function bucketOf(ms: number): number {
  return USAGE_BUCKETS_MS.findIndex((upper) => ms <= upper);
}

export class UsageRecorder {
  private rows = new Map<string, Row>();
  private lastRequest = new Map<string, Date>();
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private failing = false;

  constructor(
    private readonly db: Db,
    private readonly log: Logger,
    /** Told of every request as it is recorded (the Prometheus counters in metrics/metrics.ts). */
    private readonly observe?: (e: UsageEvent) => void,
  ) {}

  start(everyMs = 1000) {
    // A write still under way (the database slow or away) is not queued behind: the next tick takes its rows.
    this.timer = setInterval(() => {
      if (!this.writing) void this.flush();
    }, everyMs);
    this.timer.unref();
  }

  /** Stops the timer and writes what is left (best effort: the database may be gone at shutdown). */
  async stop() {
    clearInterval(this.timer);
    await this.flush();
  }

  /** A model was asked for now (before it is answered: an on-demand model's idle clock restarts at once). */
  touch(model: string, at = new Date()) {
    const seen = this.lastRequest.get(model);
    if (!seen || seen < at) this.lastRequest.set(model, at);
  }

  record(e: UsageEvent) {
    this.observe?.(e);
    const minute = new Date(Math.floor(e.at.getTime() / 60_000) * 60_000);
    const key = `${minute.getTime()}\u0000${e.tokenId}\u0000${e.model}\u0000${e.adapter}\u0000${e.replicaId}`;
    let row = this.rows.get(key);
    if (!row) {
      row = {
        minute,
        tokenId: e.tokenId,
        userId: e.userId,
        model: e.model,
        adapter: e.adapter,
        node: e.node,
        replicaId: e.replicaId,
        requests: 0,
        errors: 0,
        aborted: 0,
        promptTokens: 0,
        completionTokens: 0,
        ttftMsSum: 0,
        ttftCount: 0,
        durationMsSum: 0,
        buckets: USAGE_BUCKETS_MS.map(() => 0),
      };
      this.rows.set(key, row);
    }
    row.requests++;
    if (e.outcome === 'error') row.errors++;
    if (e.outcome === 'aborted') row.aborted++;
    row.promptTokens += e.promptTokens;
    row.completionTokens += e.completionTokens;
    if (e.ttftMs !== null) {
      row.ttftMsSum += e.ttftMs;
      row.ttftCount++;
    }
    row.durationMsSum += e.durationMs;
    row.buckets[bucketOf(e.durationMs)]! += 1;
    this.touch(e.model, e.at);
  }

  /**
   * Writes everything recorded before the call. A write already under way took only the rows gathered before it
   * began, so this waits for it and then writes the rest (at shutdown, the last requests are not lost to the
   * timer's write). One write at a time.
   */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
    // On the loops' connections: a burst of model calls must not keep their usage from being written.
    this.writing = this.write().finally(() => {
      this.writing = undefined;
    });
    return this.writing;
  }

  private async write() {
    const rows = [...this.rows.values()];
    const touched = [...this.lastRequest.entries()];
    if (!rows.length && !touched.length) return;
    this.rows = new Map();
    this.lastRequest = new Map();
    try {
      await this.db.loops.$transaction(async (tx) => {
        if (rows.length) await tx.$executeRawUnsafe(UPSERT, ...columns(rows));
        if (touched.length) {
          await tx.$executeRawUnsafe(
            TOUCH,
            touched.map(([m]) => m),
            touched.map(([, at]) => at.toISOString()),
          );
        }
      });
      if (this.failing) this.log.info('gateway: usage is written again');
      this.failing = false;
    } catch (err) {
      if (!this.failing) {
        this.log.warn('gateway: could not write usage; kept in memory for the next write', {
          error: (err as Error).message,
        });
      }
      this.failing = true;
      for (const r of rows) this.merge(r);
      for (const [m, at] of touched) this.touch(m, at);
    }
  }

  private merge(r: Row) {
    const key = `${r.minute.getTime()}\u0000${r.tokenId}\u0000${r.model}\u0000${r.adapter}\u0000${r.replicaId}`;
    const into = this.rows.get(key);
    if (!into) return void this.rows.set(key, r);
    into.requests += r.requests;
    into.errors += r.errors;
    into.aborted += r.aborted;
    into.promptTokens += r.promptTokens;
    into.completionTokens += r.completionTokens;
    into.ttftMsSum += r.ttftMsSum;
    into.ttftCount += r.ttftCount;
    into.durationMsSum += r.durationMsSum;
    into.buckets = into.buckets.map((n, i) => n + (r.buckets[i] ?? 0));
  }
}

// One statement for the whole batch: arrays in, one row each out. The histogram travels as text ('{1,0,…}')
// because unnest() flattens a two-dimensional array; it is added element by element on conflict.
const UPSERT = `
INSERT INTO "UsageMinute" (minute, "tokenId", "userId", model, adapter, node, "replicaId", requests, errors, aborted,
  "promptTokens", "completionTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
SELECT m::timestamp, t, u, mo, a, n, r, q, e, ab, p, c, ts, tc, ds, b::int[]
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[],
  $9::int[], $10::int[], $11::bigint[], $12::bigint[], $13::float8[], $14::int[], $15::float8[], $16::text[])
  AS x(m, t, u, mo, a, n, r, q, e, ab, p, c, ts, tc, ds, b)
ON CONFLICT (minute, "tokenId", model, adapter, "replicaId") DO UPDATE SET
  requests = "UsageMinute".requests + excluded.requests,
  errors = "UsageMinute".errors + excluded.errors,
  aborted = "UsageMinute".aborted + excluded.aborted,
  "promptTokens" = "UsageMinute"."promptTokens" + excluded."promptTokens",
  "completionTokens" = "UsageMinute"."completionTokens" + excluded."completionTokens",
  "ttftMsSum" = "UsageMinute"."ttftMsSum" + excluded."ttftMsSum",
  "ttftCount" = "UsageMinute"."ttftCount" + excluded."ttftCount",
  "durationMsSum" = "UsageMinute"."durationMsSum" + excluded."durationMsSum",
  "durationBuckets" = (
    SELECT array_agg(COALESCE(o, 0) + COALESCE(n, 0) ORDER BY i)
    FROM unnest("UsageMinute"."durationBuckets", excluded."durationBuckets") WITH ORDINALITY AS h(o, n, i))`;

// The idle clock of an on-demand model (min 0, max ≥ 1) runs from its last request: it stays awake until then
// plus its idle time. Never moved backwards (another replica may have written a later request).
const TOUCH = `
UPDATE "CatalogModel" AS c SET
  "lastRequestAt" = GREATEST(COALESCE(c."lastRequestAt", x.at), x.at),
  "awakeUntil" = CASE WHEN c."minReplicas" = 0 AND c."maxReplicas" > 0
    THEN GREATEST(COALESCE(c."awakeUntil", x.at), x.at + c."idleSeconds" * interval '1 second')
    ELSE c."awakeUntil" END
FROM (SELECT * FROM unnest($1::text[], $2::timestamp[]) AS u(name, at)) AS x
WHERE c.name = x.name`;

function columns(rows: Row[]): unknown[] {
  return [
    rows.map((r) => r.minute.toISOString()),
    rows.map((r) => r.tokenId),
    rows.map((r) => r.userId),
    rows.map((r) => r.model),
    rows.map((r) => r.adapter),
    rows.map((r) => r.node),
    rows.map((r) => r.replicaId),
    rows.map((r) => r.requests),
    rows.map((r) => r.errors),
    rows.map((r) => r.aborted),
    rows.map((r) => r.promptTokens),
    rows.map((r) => r.completionTokens),
    rows.map((r) => r.ttftMsSum),
    rows.map((r) => r.ttftCount),
    rows.map((r) => r.durationMsSum),
    rows.map((r) => `{${r.buckets.join(',')}}`),
  ];
}
