import type { Logger } from '@hangar/common/log';
import type { Db } from '../db/client.js';
import type { LoopHealth } from '../db/outage.js';
import type { CatalogModel, Replica } from '../generated/prisma/client.js';
import type { PubSub } from '../pubsub.js';

// When the placement pass (fleet-placement.ts) runs. It reads the whole catalog and fleet, so running it every few
// seconds made an idle server's CPU grow with the catalog (a thousand models cost more than a hundred doing
// nothing). It runs now when something says the answer may have changed:
//   - the `model` event the database's triggers send for every change to a model, a replica or an adapter
//     (catalog/model-events.ts), whoever made it: a mutation, an agent's report, another server, the pass itself;
//   - the nodes online now are not those the last pass saw (a node stopped reporting, or came): one small read of
//     the nodes every few seconds, which grows with the fleet, not the catalog;
//   - time alone changes the answer: an on-demand model's awake-until passes, an ended replica is due to be cleared;
//   - the last pass left work only time finishes (a replica no card has room for yet, a drain): as before, a pass
//     every few seconds until it is done;
//   - the last pass failed, the events are not heard (then every few seconds, as before), or they are back after
//     a break (what was said meanwhile went unheard);
//   - and every HANGAR_PLACEMENT_REREAD_SECONDS as a safety net.
// With several servers every one hears the events and passes; the pass's advisory lock puts them one after the
// other, and the later ones find the work done.

/** Ended replicas (STOPPED, LOST) are kept this long for an operator to see, then cleared away; FAILED longer. */
export const ENDED_KEPT_MS = 10 * 60_000;
export const FAILED_KEPT_MS = 30 * 60_000;

/** Events heard within this long of the first go to one pass: a change touches several rows. */
const COALESCE_MS = 5;

/** What a pass found, from which the schedule tells whether the next is needed before anything changes. */
export type PassOutcome = {
  /** The nodes online at the pass (onlineKey). */
  online: string;
  /** False when it left work that only time finishes: a replica it found no room for, a drain under way. */
  settled: boolean;
  /** When (database clock, ms) time alone changes its answer; null for never. */
  dueAt: number | null;
};

/** Online nodes' ids in one string, to compare one look with another. */
export const onlineKey = (ids: Iterable<string>) => [...ids].sort().join(',');

export function passOutcome(p: {
  now: Date;
  online: Iterable<string>;
  models: Pick<CatalogModel, 'awakeUntil'>[];
  replicas: Pick<Replica, 'state' | 'updatedAt'>[];
  settled: boolean;
}): PassOutcome {
  const nowMs = p.now.getTime();
  let dueAt = Number.POSITIVE_INFINITY;
  const at = (ms: number) => {
    if (ms > nowMs && ms < dueAt) dueAt = ms;
  };
  // An awake on-demand model falls asleep (its replica is stopped) when its awake-until passes.
  for (const m of p.models) if (m.awakeUntil) at(m.awakeUntil.getTime());
  for (const r of p.replicas) {
    if (r.state === 'STOPPED' || r.state === 'LOST') at(r.updatedAt.getTime() + ENDED_KEPT_MS);
    else if (r.state === 'FAILED') at(r.updatedAt.getTime() + FAILED_KEPT_MS);
  }
  return { online: onlineKey(p.online), settled: p.settled, dueAt: Number.isFinite(dueAt) ? dueAt : null };
}

/** The database's events, as the fleet hears them (pubsub.ts). */
export type PlacementEvents = {
  pubsub: PubSub;
  /** Since when this process has heard the events unbroken; undefined while it does not. */
  listeningSince: () => number | undefined;
};

export type PlacementScheduleDeps = {
  db: Db;
  /** The pass, what its last run found, and the nodes online now. */
  placement: {
    place(): Promise<void>;
    readonly outcome: PassOutcome | undefined;
    readonly lastPassAt: number;
    running(): boolean;
    onlineNow(): Promise<string>;
  };
  health: LoopHealth;
  /** Without them, a pass at every look (as before the pass followed events). */
  events?: PlacementEvents;
  /** HANGAR_PLACEMENT_REREAD_SECONDS in ms: the safety net's pass. */
  rereadMs: number;
  log?: Logger;
};

export class PlacementSchedule {
  private readonly db: Db;
  private readonly placement: PlacementScheduleDeps['placement'];
  private readonly health: LoopHealth;
  private readonly events: PlacementEvents | undefined;
  private readonly rereadMs: number;
  private readonly log: Logger | undefined;
  private heardSince: number | undefined;
  private coalesce: NodeJS.Timeout | undefined;
  private stopHearing: (() => void) | undefined;
  private looking = false;

  constructor({ db, placement, health, events, rereadMs, log }: PlacementScheduleDeps) {
    this.db = db;
    this.placement = placement;
    this.health = health;
    this.events = events;
    this.rereadMs = rereadMs;
    this.log = log;
  }

  /** Hears the events from now (before the first pass, so nothing said after its reads goes unheard). */
  start() {
    this.heardSince = this.events?.listeningSince();
    if (!this.events) return;
    const heard = this.events.pubsub.subscribe('model')[Symbol.asyncIterator]();
    let stopped = false;
    this.stopHearing = () => {
      stopped = true;
      void heard.return?.();
    };
    void (async () => {
      for (;;) {
        const next = await heard.next();
        if (next.done || stopped) return;
        // place() itself shares one pass among the calls made while one runs; the timer only groups a burst.
        this.coalesce ??= setTimeout(() => {
          this.coalesce = undefined;
          if (this.health.due()) void this.placement.place();
        }, COALESCE_MS);
      }
    })();
  }

  stop() {
    clearTimeout(this.coalesce);
    this.coalesce = undefined;
    this.stopHearing?.();
    this.stopHearing = undefined;
  }

  /** One look (every few seconds): a pass if one is due, else nothing but the nodes' small read. */
  async look(): Promise<void> {
    // A pass under way sees what changed before it; a change after it sends its event.
    if (this.looking || this.placement.running()) return;
    this.looking = true;
    try {
      const why = await this.due();
      if (why) {
        this.log?.debug('placement pass due', { why });
        await this.placement.place();
      }
    } catch (err) {
      // The nodes' read failed: the pass says what is wrong with the database, and is retried as it is.
      if (!this.health.failed(err)) await this.placement.place();
    } finally {
      this.looking = false;
    }
  }

  /** Why a pass is due now, or null when nothing it reads can have changed. */
  private async due(): Promise<string | null> {
    const last = this.placement.outcome;
    if (!last) return 'the last pass did not finish';
    if (!this.events) return 'no events: a pass at every look';
    const since = this.events.listeningSince();
    if (since === undefined) return 'the events are not heard';
    if (since !== this.heardSince) {
      this.heardSince = since;
      return 'the events are heard again after a break';
    }
    if (!last.settled) return 'the last pass left work for time to finish';
    if (performance.now() - this.placement.lastPassAt >= this.rereadMs) return 'the safety pass';
    if (last.dueAt !== null && this.db.clock.nowMs() >= last.dueAt) return 'time changed the answer';
    if ((await this.placement.onlineNow()) !== last.online) return 'the nodes online changed';
    return null;
  }
}
