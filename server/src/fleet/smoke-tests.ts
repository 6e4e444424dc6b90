import { type Logger, withFields } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import { systemActor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import { LeaseQueue } from '../db/lease.js';
import type { LoopHealth } from '../db/outage.js';
import { Prisma } from '../generated/prisma/client.js';
import { engineKeyOf } from './fleet-replicas.js';
import { type SmokeResult, smokeTest } from './smoke.js';

// The smoke tests that move a replica from LOADING to READY: one short request through the endpoint its agent
// said it serves on. One part of the fleet service (fleet.service.ts); a failed test asks placement for a pass,
// which places the model elsewhere.

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

export type SmokeTestsDeps = {
  db: Db;
  audit: AuditService;
  /** The fleet loops' view of the database (shared with placement): a claim that cannot reach it says so. */
  health: LoopHealth;
  /** Asks for a placement pass: a replica that failed its test is placed again elsewhere. */
  placement: { place(): Promise<void> };
  log?: Logger;
};

export class SmokeTests {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly health: LoopHealth;
  private readonly placement: { place(): Promise<void> };
  private readonly log: Logger | undefined;
  /** Claims only between start and stop: a server that is not running its loops leaves the tests to others. */
  private running = false;
  private abort = new AbortController();
  private readonly inFlight = new Set<Promise<void>>();
  private claiming: Promise<void> | undefined;

  constructor({ db, audit, health, placement, log }: SmokeTestsDeps) {
    this.db = db;
    this.audit = audit;
    this.health = health;
    this.placement = placement;
    // Its lines are the smoke tests' loop's (each with its replica's id), also when a replica's report woke it.
    this.log = log && withFields(log, { loop: 'smoke-tests' });
  }

  start() {
    this.running = true;
  }

  /** Stops claiming and aborts the tests running now; resolves once they have ended. */
  async stop(): Promise<void> {
    this.running = false;
    this.abort.abort(new Error('the server is stopping'));
    await Promise.all([...this.inFlight]);
  }

  /**
   * Runs the smoke tests that are due: replicas whose agent said they serve, LOADING until one short request
   * through their endpoint answers. Each is claimed with a lease in PostgreSQL, so with several server replicas
   * exactly one tests it, and one left by a server that went away is taken up when its lease runs out.
   * Resolves once the tests it started (and those already running) have ended.
   */
  async due(): Promise<void> {
    await this.claim();
    await Promise.all([...this.inFlight]);
  }

  /** Claims due tests up to SMOKE_PARALLEL and starts them; resolves once claiming stops (not the tests). */
  claim(): Promise<void> {
    if (!this.running) return Promise.resolve();
    // On the loops' connections (db.loops), as the tests they start.
    this.claiming ??= (async () => {
      try {
        while (this.running && this.inFlight.size < SMOKE_PARALLEL) {
          const row = await smokeLeases.claim<{ id: string; servingAt: Date }>(this.db.loops, null, {
            claimable: Prisma.sql`state = 'LOADING' AND desired = 'RUN' AND "servingAt" IS NOT NULL
              AND ${smokeLeases.expired({ orNone: true })}`,
            order: Prisma.sql`"servingAt"`,
            returning: Prisma.sql`"servingAt"`,
          });
          if (!row) break;
          const run: Promise<void> = this.run(row.id, row.servingAt)
            .catch((err) => {
              if (!this.health.failed(err))
                this.log?.error('a smoke test failed to run', { replicaId: row.id, error: err });
            })
            .finally(() => {
              this.inFlight.delete(run);
              // A slot is free: another may be waiting.
              if (this.running) void this.claim();
            });
          this.inFlight.add(run);
        }
      } catch (err) {
        if (!this.health.failed(err)) this.log?.error('claiming smoke tests failed', { error: err });
      }
    })().finally(() => {
      this.claiming = undefined;
    });
    return this.claiming;
  }

  /**
   * One smoke test of a replica through its endpoint, now (the serve job's smoke step): its answer, speed and
   * time to first token are kept with the replica. Does not change the replica's state.
   */
  async smokeReplica(replicaId: string, signal?: AbortSignal): Promise<SmokeResult> {
    const replica = await this.db.replica.findUnique({ where: { id: replicaId }, include: { model: true } });
    if (!replica) return { ok: false, reason: 'the replica is gone' };
    const result = await this.throughEndpoint(replica, signal);
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
  private async throughEndpoint(
    replica: { id: string; endpoint: string | null; model: { name: string } },
    signal?: AbortSignal,
    db: Db = this.db,
  ): Promise<SmokeResult> {
    const key = await engineKeyOf(db, replica.id);
    if (!replica.endpoint || !key)
      return { ok: false, reason: 'the replica has no endpoint and engine key: its agent never said where it serves' };
    return smokeTest({ endpoint: replica.endpoint, engineKey: key, model: replica.model.name, signal });
  }

  /** The claimed smoke test of one replica; its result is written only if the replica is still the one tested. */
  private async run(replicaId: string, servingAt: Date) {
    const replica = await this.db.loops.replica.findUnique({
      where: { id: replicaId },
      include: { model: true, node: true },
    });
    if (!replica) return;
    const result = await this.throughEndpoint(replica, this.abort.signal, this.db.loops);
    if (!result.ok && this.abort.signal.aborted) {
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
      void this.placement.place();
    }
  }
}
