import type { Logger } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import { systemActor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import { LeaseQueue } from '../db/lease.js';
import { LoopHealth } from '../db/outage.js';
import { type Node, Prisma } from '../generated/prisma/client.js';
import { decide } from './placement.js';
import { type SmokeResult, smokeTest } from './smoke.js';

// The fleet's loops: the placement pass (which replicas run where) and the smoke tests that move a replica from
// LOADING to READY. The fleet service is written in three files, each layer on the one before:
// fleet-placement.ts → fleet-replicas.ts (what agents report of their replicas) → fleet.service.ts (nodes).

/** A node is online while it has been seen within this window; its replicas are shown as lost after it. */
export const NODE_ONLINE_MS = 30_000;

export const PLACEMENT_LOCK = 0x706c6163; // 'plac'

/** A smoke test claimed by a server holds the replica this long; a server that dies leaves it to the next. */
// Only a deadline, no holder column: a result is written only to a replica still LOADING with the servingAt it
// was claimed with, so a second test of the same serving (a lease that ran out mid-test) changes nothing more.
const smokeLeases = new LeaseQueue({
  table: 'Replica',
  leaseMs: 90_000,
  untilColumn: 'smokeLeaseUntil',
  ownerColumn: null,
});
/** Smoke tests one server runs at once (each is one short request). */
const SMOKE_PARALLEL = 8;

export const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;

export class FleetPlacement {
  protected timer: NodeJS.Timeout | undefined;
  protected placing: Promise<void> | undefined;
  /** Placement's view of the database: passes pause while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(
    protected readonly db: Db,
    protected readonly audit: AuditService,
    protected readonly log?: Logger,
  ) {
    this.health = new LoopHealth('placement', log);
  }

  protected agentUrlOf: () => string = () => 'http://localhost:4000';
  /** The URL agents are given (HANGAR_URL): the one sources name, so the node token goes to that origin only. */
  setAgentUrl(get: () => string) {
    this.agentUrlOf = get;
  }
  agentUrl() {
    return this.agentUrlOf();
  }

  /** Runs the placement pass now and every few seconds (node heartbeats and idle timers change the answer). */
  startPlacement(everyMs = 5000) {
    this.smoking = true;
    this.timer = setInterval(() => {
      if (!this.health.due()) return;
      void this.place();
      // Smoke tests a server that stopped (or died) left unfinished, and any whose report came in elsewhere.
      void this.claimSmokes();
    }, everyMs);
    this.place();
    void this.claimSmokes();
  }
  async stopPlacement() {
    clearInterval(this.timer);
    this.smoking = false;
    this.smokeAbort.abort(new Error('the server is stopping'));
    await this.next;
    await this.placing;
    await Promise.all([...this.smokes]);
  }

  protected smoking = false;
  protected smokeAbort = new AbortController();
  protected readonly smokes = new Set<Promise<void>>();
  protected claimingSmokes: Promise<void> | undefined;

  /**
   * Runs the smoke tests that are due: replicas whose agent said they serve, LOADING until one short request
   * through their endpoint answers. Each is claimed with a lease in PostgreSQL, so with several server replicas
   * exactly one tests it, and one left by a server that went away is taken up when its lease runs out.
   * Resolves once the tests it started (and those already running) have ended.
   */
  async smokeDue(): Promise<void> {
    await this.claimSmokes();
    await Promise.all([...this.smokes]);
  }

  protected claimSmokes(): Promise<void> {
    if (!this.smoking) return Promise.resolve();
    // On the loops' connections (db.loops), as the tests they start.
    this.claimingSmokes ??= (async () => {
      try {
        while (this.smoking && this.smokes.size < SMOKE_PARALLEL) {
          const row = await smokeLeases.claim<{ id: string; servingAt: Date }>(this.db.loops, null, {
            claimable: Prisma.sql`state = 'LOADING' AND desired = 'RUN' AND "servingAt" IS NOT NULL
              AND ${smokeLeases.expired({ orNone: true })}`,
            order: Prisma.sql`"servingAt"`,
            returning: Prisma.sql`"servingAt"`,
          });
          if (!row) break;
          const run: Promise<void> = this.runSmoke(row.id, row.servingAt)
            .catch((err) => {
              if (!this.health.failed(err))
                this.log?.error('a smoke test failed to run', { replicaId: row.id, error: err });
            })
            .finally(() => {
              this.smokes.delete(run);
              // A slot is free: another may be waiting.
              if (this.smoking) void this.claimSmokes();
            });
          this.smokes.add(run);
        }
      } catch (err) {
        if (!this.health.failed(err)) this.log?.error('claiming smoke tests failed', { error: err });
      }
    })().finally(() => {
      this.claimingSmokes = undefined;
    });
    return this.claimingSmokes;
  }

  /** The engine key of a replica, for the requests the control plane sends it. Never returned by the API. */
  async engineKey(replicaId: string, db: Db = this.db): Promise<string | null> {
    return (await db.engineKey.findUnique({ where: { replicaId } }))?.key ?? null;
  }

  /**
   * One smoke test of a replica through its endpoint, now (the serve job's smoke step): its answer, speed and
   * time to first token are kept with the replica. Does not change the replica's state.
   */
  async smokeReplica(replicaId: string, signal?: AbortSignal): Promise<SmokeResult> {
    const replica = await this.db.replica.findUnique({ where: { id: replicaId }, include: { model: true } });
    if (!replica) return { ok: false, reason: 'the replica is gone' };
    const result = await this.smokeThroughEndpoint(replica, signal);
    if (result.ok)
      await this.db.replica.updateMany({
        where: { id: replicaId, state: 'READY' },
        data: {
          smokeText: result.text,
          tokensPerSecond: result.tokensPerSecond,
          timeToFirstTokenMs: result.timeToFirstTokenMs,
          smokedAt: new Date(),
        },
      });
    return result;
  }

  /** One chat request through the replica's endpoint with its engine key; a replica lacking either fails it. */
  protected async smokeThroughEndpoint(
    replica: { id: string; endpoint: string | null; model: { name: string } },
    signal?: AbortSignal,
    db: Db = this.db,
  ): Promise<SmokeResult> {
    const key = await this.engineKey(replica.id, db);
    if (!replica.endpoint || !key)
      return { ok: false, reason: 'the replica has no endpoint and engine key: its agent never said where it serves' };
    return smokeTest({ endpoint: replica.endpoint, engineKey: key, model: replica.model.name, signal });
  }

  /** The claimed smoke test of one replica; its result is written only if the replica is still the one tested. */
  protected async runSmoke(replicaId: string, servingAt: Date) {
    const replica = await this.db.loops.replica.findUnique({
      where: { id: replicaId },
      include: { model: true, node: true },
    });
    if (!replica) return;
    const result = await this.smokeThroughEndpoint(replica, this.smokeAbort.signal, this.db.loops);
    if (!result.ok && this.smokeAbort.signal.aborted) {
      // Not the replica's failure: the next start (or another server) tests it at once.
      await this.db.loops.replica
        .updateMany({ where: { id: replicaId, servingAt }, data: { smokeLeaseUntil: null } })
        .catch(() => {});
      return;
    }
    const actor = systemActor('smoke test', `smoke-${replicaId}`);
    const changed = await this.db.loops.$transaction(async (tx) => {
      const data = result.ok
        ? {
            state: 'READY' as const,
            smokeText: result.text,
            tokensPerSecond: result.tokensPerSecond,
            timeToFirstTokenMs: result.timeToFirstTokenMs,
            smokedAt: new Date(),
            smokeLeaseUntil: null,
          }
        : { state: 'FAILED' as const, message: `smoke test: ${result.reason}`, smokeLeaseUntil: null };
      // Only the replica as it was claimed: stopped meanwhile, or reloaded (a new servingAt), it is left alone.
      const u = await tx.replica.updateMany({
        where: { id: replicaId, state: 'LOADING', desired: 'RUN', servingAt },
        data,
      });
      if (u.count === 0) return false;
      if (!result.ok) await tx.engineKey.deleteMany({ where: { replicaId } });
      await this.audit.done(tx, actor, {
        action: 'smokeTest',
        target: replica.model.name,
        owner: replica.model.owner,
        message: `${replica.node?.name ?? 'a node'}: ${
          result.ok
            ? `ready: answered in ${Math.round(result.timeToFirstTokenMs)} ms to the first token, ${result.tokensPerSecond.toFixed(1)} tokens/s`
            : `smoke test: ${result.reason}`
        }`,
      });
      return true;
    });
    if (changed && !result.ok) {
      this.log?.warn('a replica failed its smoke test', {
        replicaId,
        model: replica.model.name,
        node: replica.node?.name,
        reason: result.reason,
      });
      void this.place();
    }
  }

  protected next: Promise<void> | undefined;

  /**
   * One placement pass. A call while a pass runs gets the pass after it (which sees whatever changed), and
   * every call made meanwhile shares that one.
   */
  place(): Promise<void> {
    if (!this.placing) {
      this.placing = this.pass()
        .then(() => this.health.ok())
        .catch((err) => {
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

  protected async pass() {
    // The database's clock: nodes' last reports and models' awake-until are written on it (db/clock.ts).
    const now = this.db.clock.now();
    // On the loops' connections (db.loops), also when a request asked for the pass.
    await this.db.loops.$transaction(async (tx) => {
      // With several server replicas, one places at a time; the others find the work done.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      const [models, nodes, replicas] = await Promise.all([
        tx.catalogModel.findMany(),
        tx.node.findMany(),
        tx.replica.findMany(),
      ]);
      const actions = decide(
        models,
        nodes.map((n) => ({ ...n, online: this.isOnline(n, now.getTime()) })),
        replicas,
        now,
      );
      for (const l of actions.lost)
        await tx.replica.update({ where: { id: l.replicaId }, data: { state: 'LOST', message: l.message } });
      const online = new Set(nodes.filter((n) => this.isOnline(n, now.getTime())).map((n) => n.id));
      for (const id of actions.stop) {
        const r = replicas.find((x) => x.id === id);
        // Nobody is running a replica that was never placed, or whose node is gone: it is stopped as of now.
        const direct = !r?.nodeId || !online.has(r.nodeId) || r.state === 'PENDING';
        await tx.replica.update({
          where: { id },
          data: direct ? { desired: 'STOP', state: 'STOPPED', message: 'stopped' } : { desired: 'STOP' },
        });
      }
      for (const id of actions.keep) await tx.replica.update({ where: { id }, data: { desired: 'RUN' } });
      for (const p of actions.place) {
        const data = { nodeId: p.nodeId, message: p.message, gpuIndex: p.gpuIndex ?? null };
        if (p.replicaId) await tx.replica.update({ where: { id: p.replicaId }, data });
        else await tx.replica.create({ data: { modelId: p.modelId, ...data } });
      }
      // Ended replicas are kept a while so an operator can see what happened, then cleared away.
      await tx.replica.deleteMany({
        where: { state: { in: ['STOPPED', 'LOST'] }, updatedAt: { lt: new Date(now.getTime() - 10 * 60_000) } },
      });
      await tx.replica.deleteMany({
        where: { state: 'FAILED', updatedAt: { lt: new Date(now.getTime() - 30 * 60_000) } },
      });
    });
  }

  /** What a node's agent should be running or stopping. */

  /** Seen lately, and not gone since: an agent that said it is stopping is offline at once. */
  isOnline(node: Pick<Node, 'lastSeenAt' | 'leftAt'>, now = this.db.clock.nowMs()) {
    if (!node.lastSeenAt || now - node.lastSeenAt.getTime() >= NODE_ONLINE_MS) return false;
    return !node.leftAt || node.leftAt < node.lastSeenAt;
  }
}
