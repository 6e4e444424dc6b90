// The one clock leases and liveness are judged on: the database's. A node's last report, a job's lease, a
// model's awake-until are written by whichever server replica took the request and read by another, and a
// server's own wall clock can jump (an NTP step after a VM resumed, somebody setting the date): a jump of ten
// minutes once failed a training job as "stopped reporting for 120 s" while its node reported every 2 s, and
// showed the node offline. So those timestamps are written and compared on PostgreSQL's now(): in SQL where the
// comparison is in a query, and through this clock where it is made in memory (a node's `online`, a sweep's
// cut-off). It reads the database's now() once and carries it forward on the monotonic clock, which no setting
// of the date moves; it reads it again every minute, so a step of the database's own clock is followed.
// Dates that people set and read as dates (a token's expiry, a session's end) stay on the wall clock: a jump
// moves them by its size and no more, and nothing is judged dead by them.

import type { PrismaClient } from '../generated/prisma/client.js';

const RESYNC_MS = 60_000;

export class DatabaseClock {
  private anchor: { db: number; mono: number } | undefined;
  private syncing: Promise<void> | undefined;

  constructor(private readonly db: Pick<PrismaClient, '$queryRaw'>) {}

  /** Reads the database's now(), halfway through the round trip. Started by createApp before any loop runs. */
  sync(): Promise<void> {
    this.syncing ??= (async () => {
      const before = performance.now();
      const rows = await this.db.$queryRaw<{ now: Date }[]>`SELECT now() AS now`;
      const after = performance.now();
      const at = rows[0]?.now;
      if (at) this.anchor = { db: at.getTime(), mono: (before + after) / 2 };
    })().finally(() => {
      this.syncing = undefined;
    });
    return this.syncing;
  }

  /** The database's now, in milliseconds since the epoch. */
  nowMs(): number {
    const anchor = this.anchor;
    const mono = performance.now();
    // Read again in the background once a minute; while the database is away the last reading carries on.
    if (!anchor || mono - anchor.mono > RESYNC_MS) this.sync().catch(() => {});
    // Before the first reading (a client made outside createApp, in a test) the wall clock is all there is.
    return anchor ? anchor.db + (mono - anchor.mono) : Date.now();
  }

  now(): Date {
    return new Date(this.nowMs());
  }
}
