import { type Logger, withFields } from '@hangar/common/log';
import { modelsForPlacement } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { LoopHealth } from '../db/outage.js';
import type { Node } from '../generated/prisma/client.js';
import { drainsFirst, finishDrains, placementView, stillDraining } from './drain.js';
import type { GpuMargin } from './gpu-room.js';
import { decide } from './placement.js';
import { ENDED_KEPT_MS, FAILED_KEPT_MS, onlineKey, type PassOutcome, passOutcome } from './placement-schedule.js';

// The placement pass: which replicas run where, applied to the database. One part of the fleet service
// (fleet.service.ts), given the database and the fleet loops' health; the smoke tests (smoke-tests.ts) and the
// agents' replica reports (fleet-replicas.ts) ask it for a pass when what they changed may move a replica.

/** A node is online while it has been seen within this window; its replicas are shown as lost after it. */
export const NODE_ONLINE_MS = 30_000;

export const PLACEMENT_LOCK = 0x706c6163; // 'plac'

export const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;

/** Seen lately, and not gone since: an agent that said it is stopping is offline at once. */
export function onlineAt(node: Pick<Node, 'lastSeenAt' | 'leftAt'>, nowMs: number): boolean {
  if (!node.lastSeenAt || nowMs - node.lastSeenAt.getTime() >= NODE_ONLINE_MS) return false;
  return !node.leftAt || node.leftAt < node.lastSeenAt;
}

export type FleetPlacementDeps = {
  db: Db;
  /** The fleet loops' view of the database (shared with the smoke tests): a pass that cannot reach it says so. */
  health: LoopHealth;
  log?: Logger;
  /** HANGAR_GPU_MEMORY_MARGIN: what each card keeps unbooked (gpu-room.ts; default 10 %). */
  margin?: GpuMargin;
  /** HANGAR_DRAIN_GRACE_SECONDS in ms: how long a replica being removed may finish its requests. */
  drainGraceMs?: number;
};

export class FleetPlacement {
  private readonly db: Db;
  private readonly health: LoopHealth;
  private readonly log: Logger | undefined;
  private readonly margin: GpuMargin | undefined;
  private readonly drainGraceMs: number;
  /** Replicas still draining after the last pass: the scaling loop asks for passes while there are any. */
  draining = 0;
  /** What the last pass that ran to its end found (placement-schedule.ts decides from it when the next is due). */
  outcome: PassOutcome | undefined;
  /** When the last pass that ran to its end began (performance.now()). */
  lastPassAt = 0;
  private drainTimer: NodeJS.Timeout | undefined;
  private placing: Promise<void> | undefined;
  private next: Promise<void> | undefined;

  constructor({ db, health, log, margin, drainGraceMs }: FleetPlacementDeps) {
    this.db = db;
    this.drainGraceMs = drainGraceMs ?? 120_000;
    this.margin = margin;
    this.health = health;
    // Its lines are the placement loop's, also when a request asked for a pass: the pass serves every request since.
    this.log = log && withFields(log, { loop: 'placement' });
  }

  /**
   * One placement pass. A call while a pass runs gets the pass after it (which sees whatever changed), and
   * every call made meanwhile shares that one.
   */
  place(): Promise<void> {
    if (!this.placing) {
      const startedAt = performance.now();
      this.placing = this.pass()
        .then((outcome) => {
          this.health.ok();
          this.outcome = outcome;
          this.lastPassAt = startedAt;
          // A drain under way finishes at a pass after its last request: soon, not at the loop's next tick.
          if (this.draining > 0 && !this.drainTimer)
            this.drainTimer = setTimeout(() => {
              this.drainTimer = undefined;
              void this.place();
            }, 1000).unref();
        })
        .catch((err) => {
          // Not known what holds now: the next look runs a pass whatever else it finds.
          this.outcome = undefined;
          // The database out of reach is logged once and the pass tried again later; anything else is a bug.
          if (!this.health.failed(err)) this.log?.error('the placement pass failed', { error: err });
        })
        .finally(() => {
          this.placing = undefined;
        });
      return this.placing;
    }
    this.next ??= this.placing.then(() => {
      this.next = undefined;
      return this.place();
    });
    return this.next;
  }

  /** Whether a pass is under way. */
  running(): boolean {
    return this.placing !== undefined;
  }

  /** The nodes online now, as a pass's outcome names them: one small read of the nodes, not of the catalog. */
  async onlineNow(): Promise<string> {
    const nodes = await this.db.loops.node.findMany({ select: { id: true, lastSeenAt: true, leftAt: true } });
    const nowMs = this.db.clock.nowMs();
    return onlineKey(nodes.filter((n) => onlineAt(n, nowMs)).map((n) => n.id));
  }

  /** Resolves once the pass running now, and the one asked for after it, have ended (the server is stopping). */
  async settled(): Promise<void> {
    clearTimeout(this.drainTimer);
    await this.next;
    await this.placing;
  }

  private async pass(): Promise<PassOutcome> {
    // The database's clock: nodes' last reports and models' awake-until are written on it (db/clock.ts).
    const now = this.db.clock.now();
    // On the loops' connections (db.loops), also when a request asked for the pass.
    return this.db.loops.$transaction(async (tx) => {
      // With several server replicas, one places at a time; the others find the work done.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      const [models, nodes, replicas, scaled] = await Promise.all([
        modelsForPlacement(tx),
        tx.node.findMany(),
        tx.replica.findMany(),
        tx.modelScale.findMany({ select: { modelId: true, replicas: true } }),
      ]);
      // An autoscaled model wants what its load asked for (scaling-loop.ts); the others their fixed count.
      const scaledOf = new Map(scaled.map((s) => [s.modelId, s.replicas]));
      const actions = decide(
        models.map((m) => ({ ...m, scaledReplicas: m.targetInFlight != null ? (scaledOf.get(m.id) ?? null) : null })),
        nodes.map((n) => ({ ...n, online: onlineAt(n, now.getTime()) })),
        placementView(replicas),
        now,
        { margin: this.margin },
      );
      const byId = new Map(replicas.map((r) => [r.id, r]));
      let lostLater = 0;
      for (const l of actions.lost) {
        // A replica draining on a node whose agent left is still answering its last requests (drain.ts).
        const r = byId.get(l.replicaId);
        if (r && stillDraining(r, now, this.drainGraceMs)) {
          lostLater++;
          continue;
        }
        await tx.replica.update({ where: { id: l.replicaId }, data: { state: 'LOST', message: l.message } });
      }
      const online = new Set(nodes.filter((n) => onlineAt(n, now.getTime())).map((n) => n.id));
      for (const id of actions.stop) {
        const r = replicas.find((x) => x.id === id);
        // One that may be answering requests takes no new ones and finishes those first (drain.ts).
        if (r && drainsFirst(r, online)) {
          await tx.replica.update({
            where: { id },
            data: { drainingSince: now, message: 'draining: takes no new requests, finishing those it has' },
          });
          continue;
        }
        // Nobody is running a replica that was never placed, or whose node is gone: it is stopped as of now.
        const direct = !r?.nodeId || !online.has(r.nodeId) || r.state === 'PENDING';
        await tx.replica.update({
          where: { id },
          data: direct ? { desired: 'STOP', state: 'STOPPED', message: 'stopped' } : { desired: 'STOP' },
        });
      }
      for (const id of actions.keep)
        await tx.replica.update({ where: { id }, data: { desired: 'RUN', drainingSince: null } });
      this.draining = await finishDrains(tx, replicas, now, this.drainGraceMs);
      for (const p of actions.place) {
        const data = {
          nodeId: p.nodeId,
          message: p.message,
          gpuIndex: p.gpuIndex ?? null,
          gpuIndexes: p.gpuIndexes ?? [],
        };
        if (p.replicaId) await tx.replica.update({ where: { id: p.replicaId }, data });
        else await tx.replica.create({ data: { modelId: p.modelId, ...data } });
      }
      // Ended replicas are kept a while so an operator can see what happened, then cleared away.
      await tx.replica.deleteMany({
        where: { state: { in: ['STOPPED', 'LOST'] }, updatedAt: { lt: new Date(now.getTime() - ENDED_KEPT_MS) } },
      });
      await tx.replica.deleteMany({
        where: { state: 'FAILED', updatedAt: { lt: new Date(now.getTime() - FAILED_KEPT_MS) } },
      });
      return passOutcome({
        now,
        online,
        models,
        replicas,
        // Left for time to finish: a replica no node has room for yet (a card's memory freed, a failure's
        // exclusion over), a drain under way, a lost node's replica still draining.
        settled: actions.place.every((p) => p.nodeId !== null) && this.draining === 0 && lostLater === 0,
      });
    });
  }
}
