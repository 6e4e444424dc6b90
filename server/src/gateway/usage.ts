import type { Logger } from '@hangar/common/log';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Db } from '../db/client.js';
import { type Orphan, type SpooledRow, UsageSpool } from './usage-spool.js';

// Every request the gateway answers is accounted, but never with a database round-trip on its own path: the
// recorder adds it to a row in memory (one per minute, caller token, model, adapter and replica) and writes
// what gathered once a second, adding to the rows already there (several server replicas write the same
// minute). The same write moves each model's last request (through the catalog, whose row it is), from which an
// on-demand model's idle time counts.
// When the database is away the rows wait in memory and go with the next write that gets through: their
// number is bounded by the distinct keys of the minutes it was away, not by the requests. Each second's rows are
// also appended to a spool file in the data dir before the next second (usage-spool.ts says how a replay after a
// crash adds each of them exactly once), so a crash while they wait loses at most the last second.

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
  /** Of promptTokens, those the replica reused from its prompt cache (0 or absent: none, or not said). */
  cachedTokens?: number;
  ttftMs: number | null;
  durationMs: number;
  /** The edge's id for the call (absent for one made in-process): what tracing finds the call's span by. */
  requestId?: string;
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
  cachedTokens: number;
  ttftMsSum: number;
  ttftCount: number;
  durationMsSum: number;
  buckets: number[];
};

/**
 * A row's identity: the minute, who called (the token, and the user: console sessions all have the token '', and
 * two users' sessions in one minute are two rows), and what answered.
 */
function keyOf(r: Pick<Row, 'minute' | 'tokenId' | 'userId' | 'model' | 'adapter' | 'replicaId'>): string {
  return [r.minute.getTime(), r.tokenId, r.userId, r.model, r.adapter, r.replicaId].join('\u0000');
}

export function bucketOf(ms: number): number {
  return USAGE_BUCKETS_MS.findIndex((upper) => ms <= upper);
}

/**
 * Rows gathered over one or more seconds and spooled (usage-spool.ts), not yet known to be in the database.
 * `upTo` is the last spool line they hold. A group a write took is `attempted`: that write may have committed it
 * without hearing so, so nothing newer joins it (the next write drops it whole if the database has it).
 */
type Group = { upTo: number; rows: Map<string, Row>; attempted: boolean };

export type UsageRecorderDeps = {
  db: Db;
  log: Logger;
  /** Told of every request as it is recorded (the Prometheus counters in metrics/metrics.ts). */
  observe?: (e: UsageEvent) => void;
  /** Where usage waits on disk for the database (<HANGAR_DATA_DIR>/usage); none keeps it in memory alone. */
  spoolDir?: string;
  /**
   * The catalog, which writes each model's last request (its idle clock) in the same transaction as the usage.
   * None (a test of usage alone): the last requests are gathered and dropped at each write.
   */
  catalog?: Pick<CatalogService, 'recordLastRequest'>;
};

export class UsageRecorder {
  /** This second's rows, not yet spooled. */
  private rows = new Map<string, Row>();
  /** Spooled rows the database has not confirmed, oldest first. */
  private groups: Group[] = [];
  private seq = 0;
  /** The last spool line the database is known to hold. */
  private applied = 0;
  /** Files of processes on this host that died with usage in them, to add once (usage-spool.ts). */
  private orphans: Orphan[] = [];
  private readonly spool: UsageSpool | undefined;
  private lastRequest = new Map<string, Date>();
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private failing = false;
  private readonly db: Db;
  private readonly log: Logger;
  private readonly observe: ((e: UsageEvent) => void) | undefined;
  private readonly catalog: Pick<CatalogService, 'recordLastRequest'> | undefined;

  constructor(deps: UsageRecorderDeps) {
    this.db = deps.db;
    this.log = deps.log;
    this.observe = deps.observe;
    this.catalog = deps.catalog;
    this.spool = deps.spoolDir ? new UsageSpool({ dir: deps.spoolDir, log: deps.log }) : undefined;
  }

  async start(everyMs = 1000) {
    try {
      this.orphans = (await this.spool?.open()) ?? [];
    } catch (err) {
      // The gateway still answers: usage is then kept in memory alone, as a crash would lose it.
      this.log.error('gateway: cannot open the usage spool; usage waits in memory alone while the database is away', {
        error: (err as Error).message,
      });
    }
    // Each second's rows go to disk whatever the database does; a write still under way (the database slow or
    // away) is not queued behind: the next tick's write takes what gathered meanwhile.
    this.timer = setInterval(() => {
      const spooled = this.spoolRows();
      if (!this.writing) void spooled.then(() => this.flushSpooled());
    }, everyMs);
    this.timer.unref();
  }

  /** Stops the timer and writes what is left (best effort: the database may be gone at shutdown). */
  async stop() {
    clearInterval(this.timer);
    await this.flush();
    if (!this.spool) return;
    // Left on disk when the database did not take everything: the next start on this host adds it. Its row goes
    // only with the file (a file replayed without its row would be added again).
    const removed = await this.spool.close(this.groups.length === 0 && this.rows.size === 0).catch((err: unknown) => {
      this.log.warn('gateway: could not close the usage spool', { error: (err as Error).message });
      return false;
    });
    if (removed) await this.db.loops.$executeRawUnsafe(FORGET, [this.spool.generation]).catch(() => {});
  }

  /**
   * A model was asked for now (before it is answered: an on-demand model's idle clock restarts at once). On the
   * database's clock, as its awake-until is judged (db/clock.ts).
   */
  touch(model: string, at = this.db.clock.now()) {
    const seen = this.lastRequest.get(model);
    if (!seen || seen < at) this.lastRequest.set(model, at);
  }

  record(e: UsageEvent) {
    this.observe?.(e);
    const minute = new Date(Math.floor(e.at.getTime() / 60_000) * 60_000);
    const key = keyOf({ minute, ...e });
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
        cachedTokens: 0,
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
    row.cachedTokens += e.cachedTokens ?? 0;
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
    await this.spoolRows();
    await this.flushSpooled();
  }

  private async flushSpooled(): Promise<void> {
    while (this.writing) await this.writing;
    // On the loops' connections: a burst of model calls must not keep their usage from being written.
    this.writing = this.write().finally(() => {
      this.writing = undefined;
    });
    return this.writing;
  }

  /** Moves this second's rows to the spool (on disk before the call resolves) and to the rows to write. */
  private spoolRows(): Promise<void> {
    if (!this.rows.size) return Promise.resolve();
    const rows = this.rows;
    this.rows = new Map();
    const seq = ++this.seq;
    const last = this.groups.at(-1);
    if (last && !last.attempted) {
      for (const r of rows.values()) mergeInto(last.rows, r);
      last.upTo = seq;
    } else this.groups.push({ upTo: seq, rows, attempted: false });
    if (!this.spool) return Promise.resolve();
    return this.spool.append(seq, [...rows.values()].map(spooled)).catch((err: unknown) => {
      this.log.error('gateway: could not write usage to its spool; a crash before the database takes it loses it', {
        error: (err as Error).message,
      });
    });
  }

  private async write() {
    await this.replayOrphans();
    const touched = [...this.lastRequest.entries()];
    if (!this.groups.length && !touched.length) return;
    this.lastRequest = new Map();
    let taken: Group[] = [];
    let inDatabase: number | undefined;
    try {
      await this.db.loops.$transaction(async (tx) => {
        if (this.groups.length) {
          inDatabase = this.spool ? await appliedSeq(tx, this.spool.generation) : this.applied;
          // What is in the database now is known: the groups up to it are in, everything after it is not (a
          // write whose answer was lost committed all it took or nothing), so the rest is added as one.
          taken = [...this.groups];
          for (const g of taken) g.attempted = true;
          const rows = new Map<string, Row>();
          for (const g of taken) if (g.upTo > inDatabase) for (const r of g.rows.values()) mergeInto(rows, r);
          if (rows.size) await tx.$executeRawUnsafe(UPSERT, ...columns([...rows.values()]));
          if (this.spool) await tx.$executeRawUnsafe(APPLIED, this.spool.generation, taken.at(-1)?.upTo);
        }
        // The catalog's row, written by the catalog: in this transaction, so a write that failed keeps both.
        if (touched.length) await this.catalog?.recordLastRequest(touched, tx);
      });
      this.groups = this.groups.filter((g) => !taken.includes(g));
      this.applied = taken.at(-1)?.upTo ?? this.applied;
      if (this.failing) this.log.info('gateway: usage is written again');
      this.failing = false;
    } catch (err) {
      if (!this.failing) {
        this.log.warn('gateway: could not write usage; kept on disk and in memory for the next write', {
          error: (err as Error).message,
        });
      }
      this.failing = true;
      if (inDatabase !== undefined) this.regroup(taken, inDatabase);
      for (const [m, at] of touched) this.touch(m, at);
      return;
    }
    await this.spool
      ?.compact(() => this.groups.length === 0 && this.applied === this.seq)
      .catch((err: unknown) => {
        this.log.warn('gateway: could not empty the usage spool; it grows until the next try', {
          error: (err as Error).message,
        });
      });
  }

  /**
   * After a write that read what the database held (`inDatabase`) and then failed: the groups it took up to that
   * are in; the others become one, which that write may have committed (its answer lost) or not.
   */
  private regroup(taken: Group[], inDatabase: number) {
    const rest = taken.filter((g) => g.upTo > inDatabase);
    const later = this.groups.filter((g) => !taken.includes(g));
    this.applied = Math.max(this.applied, inDatabase);
    const last = rest.at(-1);
    if (!last) {
      this.groups = later;
      return;
    }
    const rows = new Map<string, Row>();
    for (const g of rest) for (const r of g.rows.values()) mergeInto(rows, r);
    this.groups = [{ upTo: last.upTo, rows, attempted: true }, ...later];
  }

  /**
   * Adds the spool files of processes on this host that died (one transaction each, the lines after what the
   * database holds of them), then removes each file and its row. One that fails waits for the next write.
   */
  private async replayOrphans() {
    const spool = this.spool;
    if (!spool) return;
    for (const orphan of [...this.orphans]) {
      try {
        let lines = 0;
        let requests = 0;
        await this.db.loops.$transaction(
          async (tx) => {
            const after = await appliedSeq(tx, orphan.generation);
            const rows = new Map<string, Row>();
            let upTo = after;
            for await (const line of spool.linesAfter(orphan.file, after)) {
              for (const r of line.rows) mergeInto(rows, unspooled(r));
              upTo = Math.max(upTo, line.seq);
              lines++;
            }
            for (const r of rows.values()) requests += r.requests;
            if (rows.size) await tx.$executeRawUnsafe(UPSERT, ...columns([...rows.values()]));
            await tx.$executeRawUnsafe(APPLIED, orphan.generation, upTo);
          },
          // A long outage's file is read inside the transaction.
          { timeout: 120_000 },
        );
        await spool.remove(orphan.file);
        this.orphans = this.orphans.filter((o) => o !== orphan);
        // A row left behind (this fails, or a crash now) is a few bytes that nothing reads again.
        await this.db.loops.$executeRawUnsafe(FORGET, [orphan.generation]).catch(() => {});
        if (lines) {
          this.log.info('gateway: added the usage a stopped process left in its spool', {
            file: orphan.file,
            lines,
            requests,
          });
        }
      } catch (err) {
        this.log.warn('gateway: could not add a usage spool left by a stopped process; trying again', {
          file: orphan.file,
          error: (err as Error).message,
        });
        return;
      }
    }
  }
}

/** Adds `r` to the row of its key in `rows` (a copy the first time: groups never share a row). */
function mergeInto(rows: Map<string, Row>, r: Row) {
  const key = keyOf(r);
  const into = rows.get(key);
  if (!into) return void rows.set(key, { ...r, buckets: [...r.buckets] });
  into.requests += r.requests;
  into.errors += r.errors;
  into.aborted += r.aborted;
  into.promptTokens += r.promptTokens;
  into.completionTokens += r.completionTokens;
  into.cachedTokens += r.cachedTokens;
  into.ttftMsSum += r.ttftMsSum;
  into.ttftCount += r.ttftCount;
  into.durationMsSum += r.durationMsSum;
  into.buckets = into.buckets.map((n, i) => n + (r.buckets[i] ?? 0));
}

const spooled = (r: Row): SpooledRow => ({ ...r, minute: r.minute.toISOString() });
// A line spooled before rows counted cached tokens has none: read as 0, so a spool left by the previous version
// is still added after an upgrade.
const unspooled = (r: SpooledRow): Row => ({
  ...(r as unknown as Row),
  cachedTokens: typeof r.cachedTokens === 'number' ? r.cachedTokens : 0,
  minute: new Date(r.minute),
});

/** What the database holds of a spool generation (0 for one it has never seen); its row is locked till commit. */
async function appliedSeq(tx: Pick<Db, '$queryRawUnsafe'>, generation: string): Promise<number> {
  const rows = await tx.$queryRawUnsafe<{ appliedSeq: number }[]>(
    `INSERT INTO "UsageSpool" (generation, "appliedSeq") VALUES ($1, 0)
     ON CONFLICT (generation) DO UPDATE SET "updatedAt" = now() RETURNING "appliedSeq"`,
    generation,
  );
  return Number(rows[0]?.appliedSeq ?? 0);
}

const APPLIED = `UPDATE "UsageSpool" SET "appliedSeq" = $2, "updatedAt" = now() WHERE generation = $1`;
// Once a generation's file is gone, nothing will replay it: its row goes too.
const FORGET = `DELETE FROM "UsageSpool" WHERE generation = ANY($1::text[])`;

// One statement for the whole batch: arrays in, one row each out. The histogram travels as text ('{1,0,…}')
// because unnest() flattens a two-dimensional array; it is added element by element on conflict.
const UPSERT = `
INSERT INTO "UsageMinute" (minute, "tokenId", "userId", model, adapter, node, "replicaId", requests, errors, aborted,
  "promptTokens", "completionTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets", "cachedTokens")
SELECT m::timestamp, t, u, mo, a, n, r, q, e, ab, p, c, ts, tc, ds, b::int[], ca
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[],
  $9::int[], $10::int[], $11::bigint[], $12::bigint[], $13::float8[], $14::int[], $15::float8[], $16::text[],
  $17::bigint[])
  AS x(m, t, u, mo, a, n, r, q, e, ab, p, c, ts, tc, ds, b, ca)
ON CONFLICT (minute, "tokenId", "userId", model, adapter, "replicaId") DO UPDATE SET
  requests = "UsageMinute".requests + excluded.requests,
  errors = "UsageMinute".errors + excluded.errors,
  aborted = "UsageMinute".aborted + excluded.aborted,
  "promptTokens" = "UsageMinute"."promptTokens" + excluded."promptTokens",
  "completionTokens" = "UsageMinute"."completionTokens" + excluded."completionTokens",
  "cachedTokens" = "UsageMinute"."cachedTokens" + excluded."cachedTokens",
  "ttftMsSum" = "UsageMinute"."ttftMsSum" + excluded."ttftMsSum",
  "ttftCount" = "UsageMinute"."ttftCount" + excluded."ttftCount",
  "durationMsSum" = "UsageMinute"."durationMsSum" + excluded."durationMsSum",
  "durationBuckets" = (
    SELECT array_agg(COALESCE(o, 0) + COALESCE(n, 0) ORDER BY i)
    FROM unnest("UsageMinute"."durationBuckets", excluded."durationBuckets") WITH ORDINALITY AS h(o, n, i))`;

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
    rows.map((r) => r.cachedTokens),
  ];
}
