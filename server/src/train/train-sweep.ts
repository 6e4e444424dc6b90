import type { Logger } from '@hangar/common/log';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { isDatabaseUnreachable, LoopHealth } from '../db/outage.js';
import { nodesByIds } from '../fleet/fleet-store.js';
import type { TrainJob } from '../generated/prisma/client.js';
import type { TrainLedger } from './train-ledger.js';
import type { TrainNodeSide } from './train-node.js';

// The training clock (docs/training.md): it fails the running jobs of a node that stopped reporting (their lease
// ran out), and keeps each queued job's message saying why it waits. Its state (the timer, since when this
// control plane could hear its nodes) is its own; the ends it writes go through the ledger like every other.

export type TrainSweepDeps = {
  db: Db;
  config: Config;
  ledger: TrainLedger;
  /** Why a queued job waits, in the words the node's side uses when the job is created. */
  node: Pick<TrainNodeSide, 'waitReason'>;
  log: Logger;
};

export class TrainSweep {
  /** The sweeps' view of the database: paused while it is out of reach (nothing is failed meanwhile). */
  readonly health: LoopHealth;
  private readonly db: Db;
  private readonly config: Config;
  private readonly ledger: TrainLedger;
  private readonly node: Pick<TrainNodeSide, 'waitReason'>;
  private readonly log: Logger;
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> = Promise.resolve();
  /**
   * Since when this control plane has been able to hear its nodes: it started, or its database came back. The
   * lost clock counts from here at the earliest.
   */
  private hearingSince = Date.now();
  /** The last sweep found the database out of reach. */
  private deaf = false;

  constructor(deps: TrainSweepDeps) {
    this.db = deps.db;
    this.config = deps.config;
    this.ledger = deps.ledger;
    this.node = deps.node;
    this.log = deps.log;
    this.health = new LoopHealth('training sweeps', deps.log);
  }

  start(everyMs = 2000) {
    this.hearingSince = this.db.clock.nowMs();
    // The timer's sweeps do not pile up behind a slow one: a tick while one runs is skipped.
    let busy = false;
    this.timer = setInterval(() => {
      if (busy || !this.health.due()) return;
      busy = true;
      void this.sweep().finally(() => {
        busy = false;
      });
    }, everyMs);
    void this.sweep();
  }
  stop() {
    clearInterval(this.timer);
  }

  /**
   * One sweep at a time; a call made during one runs after it (its `now` may be later than the timer's). Judged
   * on the database's clock, which the leases are written on; never on this server's wall clock, which can jump.
   */
  sweep(now?: Date): Promise<void> {
    this.sweeping = this.sweeping.then(() => this.sweepOnce(now ?? this.db.clock.now()));
    return this.sweeping;
  }

  /** On the loops' connections (db.loops), also when a request asks for a sweep. */
  private async sweepOnce(now: Date) {
    try {
      const expired = await withNodes(
        this.db.loops,
        await this.db.loops.trainJob.findMany({ where: { state: 'RUNNING', leaseUntil: { lt: now } } }),
      );
      if (this.deaf) {
        this.deaf = false;
        this.hearingSince = this.db.clock.nowMs();
      }
      // A node is silent only for as long as this control plane could have heard it: one that was itself down
      // (stopped, or without its database) gives every node the whole lost time again once it is back, during
      // which the node's agent delivers what it kept (progress, the adapter, the end).
      const heard = now.getTime() - this.hearingSince >= this.config.trainLostSeconds * 1000;
      const lost = heard ? expired : [];
      for (const j of lost) {
        const secs = this.config.trainLostSeconds;
        const node = j.node?.name ?? 'its node';
        if (j.cancelRequestedAt)
          await this.ledger.end(
            j.id,
            'CANCELLED',
            `cancelled; ${node} stopped reporting for ${secs} s, so whether its trainer has exited is not known`,
            { leaseUntilBefore: now },
            undefined,
            this.db.loops,
          );
        else
          await this.ledger.end(
            j.id,
            'FAILED',
            `${node} stopped reporting for ${secs} s (offline, or its agent stopped): the run is lost; submit it again`,
            { leaseUntilBefore: now },
            undefined,
            this.db.loops,
          );
      }
      const queued = await withNodes(
        this.db.loops,
        await this.db.loops.trainJob.findMany({ where: { state: 'QUEUED' } }),
      );
      for (const j of queued) {
        const reason = j.node
          ? await this.node.waitReason(this.db.loops, j.node, j.gpuMiB, j.id)
          : 'its node was removed: delete the job, or submit it for another node';
        if (reason !== j.message) {
          await this.db.loops.$transaction(async (tx) => {
            await tx.trainJob.updateMany({ where: { id: j.id, state: 'QUEUED' }, data: { message: reason } });
            await this.ledger.changed(tx, j);
          });
        }
      }
      this.health.ok();
    } catch (err) {
      // Nodes' reports could not land either: their silence meanwhile is not theirs.
      if (isDatabaseUnreachable(err)) this.deaf = true;
      // The database out of reach is said once (not at every tick), and the sweep tried again after a backoff.
      if (!this.health.failed(err)) this.log.warn('the training sweep failed; trying again', { error: err });
    }
  }
}

/** Jobs with the node each names, from the fleet (which owns the nodes): null for none, or one removed since. */
async function withNodes(db: Db, jobs: TrainJob[]) {
  const nodes = await nodesByIds(
    db,
    jobs.flatMap((j) => (j.nodeId ? [j.nodeId] : [])),
  );
  return jobs.map((j) => ({ ...j, node: j.nodeId ? (nodes.get(j.nodeId) ?? null) : null }));
}
