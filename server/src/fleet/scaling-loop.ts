import { type Logger, withFields } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import { systemActor } from '../auth/actor.js';
import { autoscaledModels } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import { clearStaleLoad, fleetLoad } from '../gateway/load-report.js';
import { readyReplicaCounts } from './fleet-store.js';
import { initialState, type ScaleDecision, type ScaleState, scaleStep, type Trend } from './scaling.js';

// The autoscaler: every few seconds one server (whichever takes the lock first; the others find the sample taken)
// reads the load every server's gateway published (gateway/load-report.ts), takes one step of each autoscaled
// model's rule (scaling.ts), keeps the state in ModelScale so another server goes on from the same window, audits
// each decision with its reason in the same transaction, and asks for a placement pass, which places the new
// replica or drains the one removed (drain.ts).

export const SCALING_LOCK = 0x7363616c; // 'scal'

export type ScalingLoopDeps = {
  db: Db;
  audit: AuditService;
  /** HANGAR_SCALE_WINDOW_SECONDS in ms. */
  windowMs: number;
  /** The fleet's placement pass, and how many replicas it left draining (a pass finishes them). */
  fleet: { place(): Promise<void>; draining(): number };
  /** Told of each decision (Prometheus' hangar_scaling_decisions_total). */
  onDecision?: (model: string, direction: Trend) => void;
  log?: Logger;
};

export class ScalingLoop {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly windowMs: number;
  private readonly fleet: ScalingLoopDeps['fleet'];
  private readonly onDecision: ScalingLoopDeps['onDecision'];
  private readonly log: Logger | undefined;
  private readonly health: LoopHealth;
  /** Samples this often: ten to a window, within 0.25 to 5 s. */
  readonly everyMs: number;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor({ db, audit, windowMs, fleet, onDecision, log }: ScalingLoopDeps) {
    this.db = db;
    this.audit = audit;
    this.windowMs = windowMs;
    this.fleet = fleet;
    this.onDecision = onDecision;
    this.log = log && withFields(log, { loop: 'scaling' });
    this.health = new LoopHealth('scaling', log);
    this.everyMs = Math.min(5000, Math.max(250, Math.round(windowMs / 10)));
  }

  start() {
    this.timer = setInterval(() => {
      if (this.health.due()) void this.tick();
    }, this.everyMs);
    this.timer.unref();
  }

  async stop() {
    clearInterval(this.timer);
    await this.running;
  }

  /** One sample of every autoscaled model now (a tick; tests call it too). Overlapping calls share one. */
  tick(): Promise<void> {
    this.running ??= this.sample()
      .then(async (decisions) => {
        this.health.ok();
        for (const d of decisions) {
          this.onDecision?.(d.model, d.direction);
          this.log?.info('scaled a model', { model: d.model, message: d.message });
        }
        // A decision moves replicas; a drain under way finishes at the pass after its requests end.
        if (decisions.length || this.fleet.draining() > 0) await this.fleet.place();
      })
      .catch((err) => {
        if (!this.health.failed(err)) this.log?.error('the scaling pass failed', { error: err });
      })
      .finally(() => {
        this.running = undefined;
      });
    return this.running;
  }

  private async sample(): Promise<(ScaleDecision & { model: string })[]> {
    const now = this.db.clock.now();
    return this.db.loops.$transaction(async (tx) => {
      // One server samples at a time; one that finds the lock held skips this tick (the holder is sampling).
      const lock = await tx.$queryRaw<
        { locked: boolean }[]
      >`SELECT pg_try_advisory_xact_lock(${SCALING_LOCK}) AS locked`;
      if (!lock[0]?.locked) return [];
      // Only the autoscaled models and their replicas: a catalog of fixed counts costs an idle server nothing here.
      const [models, states] = await Promise.all([autoscaledModels(tx), tx.modelScale.findMany()]);
      if (!models.length && !states.length) {
        await clearStaleLoad(tx, now);
        return [];
      }
      const [ready, load, serving] = await Promise.all([
        readyReplicaCounts(tx),
        fleetLoad(tx, now),
        tx.replica.findMany({
          where: {
            modelId: { in: models.map((m) => m.id) },
            desired: 'RUN',
            drainingSince: null,
            state: { in: ['LOADING', 'READY'] },
          },
          select: { id: true, modelId: true },
        }),
      ]);
      const stateOf = new Map(states.map((s) => [s.modelId, s]));
      const inFlight = new Map<string, number>();
      for (const r of serving) inFlight.set(r.modelId, (inFlight.get(r.modelId) ?? 0) + (load.inFlight.get(r.id) ?? 0));
      const decisions: (ScaleDecision & { model: string })[] = [];
      const scaled = new Set<string>();
      for (const m of models) {
        if (m.targetInFlight == null) continue;
        scaled.add(m.id);
        const before = stateOf.get(m.id);
        // Another server sampled it within the last half tick: this one would count the same moment twice.
        if (before?.sampledAt && now.getTime() - before.sampledAt.getTime() < this.everyMs / 2) continue;
        const model = {
          name: m.name,
          minReplicas: m.minReplicas,
          maxReplicas: m.maxReplicas,
          targetInFlight: m.targetInFlight,
          awake: Boolean(m.awakeUntil && m.awakeUntil > now),
        };
        const from: ScaleState = before
          ? { ...before, trend: before.trend === 'up' || before.trend === 'down' ? before.trend : null }
          : initialState(model);
        const { state, decision } = scaleStep(
          model,
          from,
          { load: (inFlight.get(m.id) ?? 0) + (load.queued.get(m.id) ?? 0), ready: ready.get(m.id) ?? 0 },
          now,
          this.windowMs,
        );
        const data = { ...state, sampledAt: now };
        await tx.modelScale.upsert({ where: { modelId: m.id }, create: { modelId: m.id, ...data }, update: data });
        if (!decision) continue;
        await this.audit.done(tx, systemActor('autoscaler'), {
          action: 'scaleModel',
          target: m.name,
          message: decision.message,
          owner: m.owner,
        });
        decisions.push({ ...decision, model: m.name });
      }
      // A model whose target was taken away scales no more: the next target starts from a fresh window.
      const dropped = states.filter((s) => !scaled.has(s.modelId)).map((s) => s.modelId);
      if (dropped.length) await tx.modelScale.deleteMany({ where: { modelId: { in: dropped } } });
      await clearStaleLoad(tx, now);
      return decisions;
    });
  }
}
