import type { Logger } from '@hangar/common/log';
import type { Db } from '../db/client.js';
import { Prisma } from '../generated/prisma/client.js';
import { horizonsAt, type UsageRetention } from './usage-retention-setting.js';
import { LEVELS, type Level, PREFIX, QUARTER, utc } from './usage-rollup.js';

// The loop that deletes usage past HANGAR_USAGE_RETENTION (usage-retention-setting.ts), oldest grain last: the hours
// and days (usage-rollup.ts) keep answering for what the minutes no longer cover.

const HOUR_MS = 3_600_000;
const GRAINS = ['minutes', 'hours', 'days'] as const;

/** Rows deleted per statement: short transactions, so the recorder's writes never wait long behind one. */
const BATCH = 5000;

export type UsagePrunerDeps = { db: Db; retention: UsageRetention; log: Logger };

/** Deletes usage rows older than their grain's retention, in batches, every `everyMs` (an hour by default). */
export class UsagePruner {
  private readonly db: Db;
  private readonly retention: UsageRetention;
  private readonly log: Logger;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;

  constructor(deps: UsagePrunerDeps) {
    this.db = deps.db;
    this.retention = deps.retention;
    this.log = deps.log;
  }

  start(everyMs = HOUR_MS) {
    if (!GRAINS.some((g) => Number.isFinite(this.retention[g]))) return;
    this.timer = setInterval(() => void this.prune().catch(() => {}), everyMs);
    this.timer.unref();
    void this.prune().catch(() => {});
  }

  stop() {
    clearInterval(this.timer);
  }

  /** One pass (one at a time): deletes what is past each grain's horizon; the rows deleted. */
  prune(): Promise<number> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async pass(): Promise<number> {
    const h = horizonsAt(this.retention, this.db.clock.nowMs());
    let deleted = 0;
    try {
      deleted += await this.pruneLevel('minute', h.minutesFrom);
      // Quarter hours are sums of minutes: once those are gone, every step is whole hours.
      deleted += await this.pruneLevel(QUARTER, h.minutesFrom);
      deleted += await this.pruneLevel('hour', h.hoursFrom);
      // The day prefixes are sums of hours: kept as long as the hours (usage-plan.ts reads none from before them).
      deleted += await this.pruneLevel(PREFIX, h.hoursFrom);
      deleted += await this.pruneLevel('day', h.daysFrom);
    } catch (err) {
      // The database away: the next pass (an hour on) deletes what this one left.
      this.log.warn('gateway: could not prune old usage; trying again at the next pass', {
        error: (err as Error).message,
      });
      throw err;
    }
    if (deleted) this.log.info('gateway: pruned usage past HANGAR_USAGE_RETENTION', { rows: deleted });
    return deleted;
  }

  private async pruneLevel(level: Level | typeof PREFIX | typeof QUARTER, before: number): Promise<number> {
    if (!Number.isFinite(before)) return 0;
    const { table, at } = typeof level === 'string' ? LEVELS[level] : level;
    let total = 0;
    for (;;) {
      const n = await this.db.loops.$executeRaw`
        DELETE FROM ${Prisma.raw(`"${table}"`)} WHERE id IN (
          SELECT id FROM ${Prisma.raw(`"${table}"`)} WHERE ${Prisma.raw(`"${at}"`)} < ${utc(before)} LIMIT ${BATCH})`;
      total += n;
      if (n < BATCH) return total;
    }
  }
}
