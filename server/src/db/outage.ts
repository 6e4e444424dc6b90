import type { Logger } from '@hangar/common/log';
import { backoffMs, sleep } from '@hangar/common/retry';

// The control plane's background loops (downloads, placement, serve jobs, training sweeps, live events) all
// depend on PostgreSQL. When it goes away (restarted, failed over, killed) none of them may take the process
// down or fail the work they hold: they pause, say so once, and carry on when it answers again.

// Socket errors from node-postgres and the kinds @prisma/adapter-pg maps them to.
const SOCKET_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNABORTED',
]);
const ADAPTER_KINDS = new Set(['DatabaseNotReachable', 'ConnectionClosed', 'SocketTimeout', 'TooManyConnections']);
// Prisma's own codes for a server it cannot reach or that closed on it, and for a pool with no free connection.
const PRISMA_CODES = new Set(['P1001', 'P1002', 'P1017', 'P2024']);
// PostgreSQL's: connection exceptions (08…), the server shutting down, crashed or still starting (57P01-03), too
// many connections (53300), and a write refused as read-only (25006): Hangar opens no read-only transaction, so
// that is a standby answering, the old primary demoted or a load balancer that has not yet moved to the new one.
// Tried again after a backoff, it reaches the primary.
const isPgOutageCode = (code: string) =>
  /^08/.test(code) || ['57P01', '57P02', '57P03', '53300', '25006'].includes(code);
// node-postgres reports a connection cut under a query with plain Errors carrying no code.
const MESSAGES =
  /Connection terminated|connection error and is not queryable|Can't reach database server|timeout exceeded when trying to connect|the database system is (starting up|shutting down|in recovery|not yet accepting)|terminating connection due to administrator command|Client was closed and is not queryable/i;

/**
 * Whether an error means "PostgreSQL is out of reach" (worth pausing for and trying again), as opposed to a
 * query that is wrong (a bug, which trying again will not fix).
 */
export function isDatabaseUnreachable(err: unknown): boolean {
  const seen = new Set<unknown>();
  const look = (e: unknown, depth: number): boolean => {
    if (!e || typeof e !== 'object' || seen.has(e) || depth > 5) return false;
    seen.add(e);
    const o = e as { code?: unknown; kind?: unknown; message?: unknown; cause?: unknown; meta?: unknown };
    if (typeof o.code === 'string' && (SOCKET_CODES.has(o.code) || PRISMA_CODES.has(o.code) || isPgOutageCode(o.code)))
      return true;
    if (typeof o.kind === 'string' && ADAPTER_KINDS.has(o.kind)) return true;
    if (typeof o.message === 'string' && MESSAGES.test(o.message)) return true;
    const meta = o.meta as { driverAdapterError?: unknown } | undefined;
    if (look(meta?.driverAdapterError, depth + 1) || look(o.cause, depth + 1)) return true;
    // AggregateError (a connection attempt to several addresses, all refused).
    const errors = (e as { errors?: unknown }).errors;
    return Array.isArray(errors) && errors.some((x) => look(x, depth + 1));
  };
  return look(err, 0);
}

/** A short reason for the operator, without a query's text or Prisma's multi-line invocation report. */
export function outageReason(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  const lines = message.split('\n').filter((l) => l.trim() !== '');
  return (lines.find((l) => /Message: `/.test(l))?.match(/Message: `(.*)`/)?.[1] ?? lines.at(-1) ?? message).slice(
    0,
    300,
  );
}

export class Stopped extends Error {
  constructor() {
    super('stopped while waiting for the database');
  }
}

// 500 ms at the first failure, doubling to 5 s: a restart of PostgreSQL is noticed within seconds, and a long
// outage costs one try every 5 s per loop.
export const outageBackoffMs = (failures: number) => backoffMs(failures, { baseMs: 250, maxMs: 5000 });

// Everything in this process backing off until the database answers: the loops' LoopHealth and the LISTEN
// connection's retry. A failover takes the database away for the seconds the new primary needs, and each of
// them, backing off up to 5 s, would find it back at a different moment; /readyz, which waits for all of them,
// said "waiting for the database" for 5 s after the first write got through (the Patroni failover test). So the
// first to get through tells the others, and they try again at once.
const waiting = new Set<() => void>();

/** Something reached the database after an outage: whatever still backs off tries again now. */
export function databaseBack() {
  for (const wake of [...waiting]) wake();
}

/** Calls `wake` when something else in this process reaches the database; the return stops that. */
export function whenDatabaseAnswers(wake: () => void): () => void {
  waiting.add(wake);
  return () => waiting.delete(wake);
}

/**
 * One background loop's view of the database. A failed try for want of the database is logged once per outage
 * (not once per tick), the loop backs off before the next, and the return is logged once too. /readyz reads
 * `paused` to say which loops are waiting.
 */
export class LoopHealth {
  private since: number | null = null;
  private reason = '';
  private failures = 0;
  /** When the next try is due, on the monotonic clock: a jump of the wall clock must not stretch a backoff. */
  private nextAt = 0;
  private stopWaking: (() => void) | undefined;
  private retryNow: (() => void) | undefined;

  constructor(
    readonly name: string,
    private readonly log: Logger | undefined,
    private readonly backoff: (failures: number) => number = outageBackoffMs,
  ) {}

  /** False while backing off after an outage: the tick is skipped. */
  due(now = performance.now()) {
    return now >= this.nextAt;
  }

  /** A try reached the database. */
  ok() {
    const wasPaused = this.since !== null;
    if (this.since !== null) {
      this.log?.info(`${this.name}: the database is back; resumed`, {
        pausedSeconds: Math.round((Date.now() - this.since) / 1000),
      });
    }
    this.since = null;
    this.failures = 0;
    this.nextAt = 0;
    this.stopWaking?.();
    this.stopWaking = undefined;
    if (wasPaused) databaseBack();
  }

  /**
   * A try failed. True when the database was out of reach: the loop's work is paused, not failed, and tried
   * again after a backoff. False for any other error, which the caller handles as it always has.
   */
  failed(err: unknown): boolean {
    if (!isDatabaseUnreachable(err)) return false;
    const now = Date.now();
    if (this.since === null) {
      this.since = now;
      this.reason = outageReason(err);
      this.log?.warn(`${this.name}: the database is unreachable; paused until it answers again`, {
        reason: this.reason,
      });
    }
    // Tried again as soon as anything else in the process gets through, rather than after the backoff.
    this.stopWaking ??= whenDatabaseAnswers(() => {
      this.nextAt = 0;
      const retry = this.retryNow;
      // Not inside the caller's ok(): the loop's own pass, on its own.
      if (retry) setImmediate(() => this.retryNow === retry && retry());
    });
    this.failures++;
    this.nextAt = performance.now() + this.backoff(this.failures);
    return true;
  }

  /**
   * For a loop whose ticks are far apart (placement's 5 s): its pass, run as soon as the database is found back
   * rather than at the next tick. The return stops that (the loop is stopping).
   */
  whenBack(retry: () => void): () => void {
    this.retryNow = retry;
    return () => {
      if (this.retryNow === retry) this.retryNow = undefined;
    };
  }

  /** Since when this loop has been waiting for the database, or null while it runs. */
  get paused(): { since: Date; reason: string } | null {
    return this.since === null ? null : { since: new Date(this.since), reason: this.reason };
  }

  /**
   * Runs `fn` until it gets through: on an outage it waits (backing off) and tries again; any other error is
   * thrown. For writes that must not be dropped, such as a verified file's PRESENT. Throws Stopped when `stopped`
   * turns true meanwhile (a shutdown), leaving the work for the next start.
   */
  async until<T>(fn: () => Promise<T>, stopped: () => boolean): Promise<T> {
    for (;;) {
      if (stopped()) throw new Stopped();
      try {
        const value = await fn();
        this.ok();
        return value;
      } catch (err) {
        if (!this.failed(err)) throw err;
      }
      while (!this.due()) {
        if (stopped()) throw new Stopped();
        await sleep(Math.min(200, Math.max(1, this.nextAt - performance.now())));
      }
    }
  }
}
