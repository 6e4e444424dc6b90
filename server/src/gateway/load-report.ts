import { randomUUID } from 'node:crypto';
import os from 'node:os';
import type { Logger } from '@hangar/common/log';
import type { Db, Tx } from '../db/client.js';

// What this server's gateway holds open, published for the others: each server counts only the requests it
// proxies itself, and with several servers behind a load balancer none of them sees a model's whole load. The
// autoscaler (fleet/scaling-loop.ts) and draining (fleet/drain.ts) add up every server's fresh row, so they judge
// the load the replicas really carry, whichever server decides. One row per server, written about once a second
// while anything is in flight (and once more when it drops to nothing); a server that died stops writing, and its
// row stops counting once it is stale.

/** A row older than this is a server that stopped writing (it died, or lost the database): not counted. */
export const LOAD_FRESH_MS = 5000;

export type LoadCounts = {
  /** Requests in flight at each replica, by replica id (zeros may be present). */
  inFlight: ReadonlyMap<string, number>;
  /** Requests waiting for a replica of a model, by the model's name. */
  waiting: ReadonlyMap<string, number>;
  /** A model's id by its name, as the route table has it (undefined for a name it no longer has). */
  modelId: (name: string) => string | undefined;
};

export type LoadReportDeps = {
  db: Db;
  log: Logger;
  counts: () => LoadCounts;
  everyMs?: number;
};

export class LoadReport {
  /** Which server a row is: the host and process, readable in the table, and unique across restarts. */
  readonly server = `${os.hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  private readonly db: Db;
  private readonly log: Logger;
  private readonly counts: () => LoadCounts;
  private readonly everyMs: number;
  private timer: NodeJS.Timeout | undefined;
  private last = '';
  private writing: Promise<void> | undefined;
  private lastError: string | undefined;

  constructor({ db, log, counts, everyMs }: LoadReportDeps) {
    this.db = db;
    this.log = log;
    this.counts = counts;
    this.everyMs = everyMs ?? 1000;
  }

  start() {
    this.timer = setInterval(() => void this.publish(), this.everyMs);
    this.timer.unref();
  }

  async stop() {
    clearInterval(this.timer);
    await this.writing;
    // Gone, not stale: nothing this server held counts from now.
    await this.db.loops.gatewayLoad.deleteMany({ where: { server: this.server } }).catch(() => {});
  }

  /** Writes this server's counts now (when they changed, or to keep a non-empty row fresh). */
  publish(): Promise<void> {
    this.writing ??= this.write().finally(() => {
      this.writing = undefined;
    });
    return this.writing;
  }

  private async write() {
    const c = this.counts();
    const replicas: Record<string, number> = {};
    for (const [id, n] of c.inFlight) if (n > 0) replicas[id] = n;
    const queued: Record<string, number> = {};
    for (const [name, n] of c.waiting) {
      const id = c.modelId(name);
      if (id && n > 0) queued[id] = (queued[id] ?? 0) + n;
    }
    const text = JSON.stringify([replicas, queued]);
    const empty = text === '[{},{}]';
    // Nothing held, and that already written: an idle server writes nothing.
    if (empty && text === this.last) return;
    try {
      const at = this.db.clock.now();
      await this.db.loops.gatewayLoad.upsert({
        where: { server: this.server },
        create: { server: this.server, replicas, queued, at },
        update: { replicas, queued, at },
      });
      this.last = text;
      if (this.lastError) this.log.info('gateway: publishes its load again');
      this.lastError = undefined;
    } catch (err) {
      // The database away: the autoscaler cannot run without it either; tried again at the next tick.
      const message = (err as Error).message;
      if (message !== this.lastError) this.log.warn('gateway: could not publish its load', { error: message });
      this.lastError = message;
    }
  }
}

export type FleetLoad = {
  /** Requests in flight at each replica, over every server. */
  inFlight: Map<string, number>;
  /** Requests waiting for a replica of each model (by id), over every server. */
  queued: Map<string, number>;
};

/** Every server's fresh load, added up: the gateway's half of the autoscaler's sample and of a drain's check. */
export async function fleetLoad(db: Db | Tx, now: Date): Promise<FleetLoad> {
  const rows = await db.gatewayLoad.findMany({ where: { at: { gt: new Date(now.getTime() - LOAD_FRESH_MS) } } });
  const inFlight = new Map<string, number>();
  const queued = new Map<string, number>();
  const add = (into: Map<string, number>, json: unknown) => {
    if (!json || typeof json !== 'object') return;
    for (const [k, v] of Object.entries(json as Record<string, unknown>))
      if (typeof v === 'number' && v > 0) into.set(k, (into.get(k) ?? 0) + v);
  };
  for (const r of rows) {
    add(inFlight, r.replicas);
    add(queued, r.queued);
  }
  return { inFlight, queued };
}

/** Rows of servers gone long ago (a crash leaves its row behind): cleared by whichever server scales. */
export function clearStaleLoad(db: Db | Tx, now: Date) {
  return db.gatewayLoad.deleteMany({ where: { at: { lt: new Date(now.getTime() - 3600_000) } } });
}
