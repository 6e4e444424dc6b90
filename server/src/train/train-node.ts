import { z } from 'zod';
import type { Actor } from '../auth/actor.js';
import type { Config } from '../config.js';
import type { Db, Tx } from '../db/client.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { nodeById } from '../fleet/fleet-store.js';
import { largestFreeMiB } from '../fleet/node-inventory.js';
import type { Node, TrainJob } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { notify } from '../pubsub.js';
import type { RegistryService } from '../registry/registry.service.js';
import { baseFilesFromHub, baseFilesFromMirror } from './base-files.js';
import { evalSpec } from './eval-job.js';
import type { TrainParams } from './params.js';
import type { SiteGeneralQuestions } from './site-questions.js';
import type { TrainLedger } from './train-ledger.js';
import type { TrainReads, TrainSpec, TrainWorkItem } from './train-reads.js';

// The node's side of training (docs/training.md): the work a node's agent sees, its claim of a job, its reports
// under the job's lease, its finish; and why a queued job waits. The clock that fails the jobs of a node that
// stopped reporting is train-sweep.ts; what people ask is train.service.ts.

export type TrainNodeSideDeps = {
  db: Db;
  config: Config;
  /** Whether a node is online, as fleet judges it (a job waits for an offline node's agent). */
  fleet: Pick<FleetService, 'isOnline'>;
  mirror: MirrorService;
  registry: RegistryService;
  reads: TrainReads;
  ledger: TrainLedger;
  /** The general questions each job's evaluation asks (Hangar's, or hangar.yaml's). */
  general: Pick<SiteGeneralQuestions, 'current'>;
};

export class TrainNodeSide {
  private readonly db: Db;
  private readonly config: Config;
  private readonly fleet: Pick<FleetService, 'isOnline'>;
  private readonly mirror: MirrorService;
  private readonly registry: RegistryService;
  private readonly reads: TrainReads;
  private readonly ledger: TrainLedger;
  private readonly general: Pick<SiteGeneralQuestions, 'current'>;

  constructor(deps: TrainNodeSideDeps) {
    this.db = deps.db;
    this.config = deps.config;
    this.fleet = deps.fleet;
    this.mirror = deps.mirror;
    this.registry = deps.registry;
    this.reads = deps.reads;
    this.ledger = deps.ledger;
    this.general = deps.general;
  }

  /** The work a node's agent should see (docs/training.md): its queued jobs that fit now, and its running ones. */
  async work(nodeId: string): Promise<TrainWorkItem[]> {
    const node = await nodeById(this.db, nodeId);
    if (!node) return [];
    const jobs = await this.db.trainJob.findMany({
      where: {
        OR: [
          { nodeId, state: 'QUEUED' },
          { leaseOwner: nodeId, state: 'RUNNING' },
        ],
      },
      orderBy: { createdAt: 'asc' },
    });
    const free = largestFreeMiB(node);
    const online = this.fleet.isOnline(node);
    return jobs
      .filter((j) => j.state === 'RUNNING' || (online && free >= j.gpuMiB))
      .map((j) => ({
        id: j.id,
        name: j.name,
        state: j.state as 'QUEUED' | 'RUNNING',
        gpuMiB: j.gpuMiB,
        cancelRequested: j.cancelRequestedAt !== null,
      }));
  }

  /** One runner, ever: the claim is a single conditional UPDATE, and only the node the job names may make it. */
  async claim(actor: Actor, id: string): Promise<Result<{ job: TrainJob; spec: TrainSpec }>> {
    if (actor.viewer.kind !== 'node') return fail(new ConflictError('only a node agent claims a job'));
    const node = actor.viewer.node;
    const job = await this.reads.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.nodeId !== node.id) return fail(new ConflictError(`the job is for another node, not ${node.name}`));
    if (job.state !== 'QUEUED') return fail(new ConflictError(`the job is ${job.state.toLowerCase()}, not queued`));

    // Where the base weights come from is settled at claim time: a copy mirrored since the job was created wins.
    let files = await baseFilesFromMirror(this.db, this.mirror, job.baseRepo);
    if (!files.length) {
      const listed = await baseFilesFromHub(this.registry, job.baseRepo, job.baseRevision);
      if (!listed.ok) {
        const message = `the base weights could not be listed: ${listed.reason}. Mirror ${job.baseRepo} (or wait for the registry) and submit the job again`;
        const failed = await this.db.$transaction(async (tx) => {
          const n = await tx.trainJob.updateMany({
            where: { id, state: 'QUEUED' },
            data: { state: 'FAILED', message, finishedAt: new Date() },
          });
          if (n.count) {
            await this.ledger.event(tx, id, 'error', message);
            await this.ledger.changed(tx, await tx.trainJob.findUniqueOrThrow({ where: { id } }));
          }
          return n.count;
        });
        return fail(new ConflictError(failed ? message : 'the job is no longer queued'));
      }
      files = listed.files;
    }

    // On the database's clock: the sweep judges the lease on it (db/clock.ts).
    const now = this.db.clock.now();
    const claimed = await this.db.$transaction(async (tx) => {
      const n = await tx.trainJob.updateMany({
        where: { id, state: 'QUEUED', nodeId: node.id },
        data: {
          state: 'RUNNING',
          leaseOwner: node.id,
          leaseUntil: this.leaseFrom(now),
          startedAt: now,
          message: `starting on ${node.name}: fetching the data and the base weights`,
        },
      });
      if (n.count !== 1) return null;
      await this.ledger.event(
        tx,
        id,
        'info',
        `claimed by node ${node.name}; base weights from ${files[0]?.url.includes('/mirror/') ? 'the mirror' : 'the registry'}`,
      );
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      await this.ledger.changed(tx, j);
      return j;
    });
    if (!claimed) return fail(new ConflictError('another runner claimed the job first'));
    const spec: TrainSpec = {
      id,
      name: claimed.name,
      base_repo: claimed.baseRepo,
      base_revision: claimed.baseRevision,
      params: claimed.params as TrainParams,
      data: { url: this.reads.dataUrl(id), sha256: claimed.dataSha256, bytes: claimed.dataBytes, pairs: claimed.pairs },
      base: { files },
      gguf: claimed.gguf,
      eval: await evalSpec(
        { db: this.db, mirror: this.mirror, reads: this.reads, general: this.general.current() },
        claimed,
      ),
    };
    return ok({ job: claimed, spec });
  }

  /** Until when a job's lease holds from `now`: past it, the sweep counts the node as lost. */
  private leaseFrom(now: Date) {
    return new Date(now.getTime() + this.config.trainLostSeconds * 1000);
  }

  /** The job, when the calling node holds its lease; otherwise why not (a late or foreign report). */
  private async leased(actor: Actor, id: string): Promise<Result<TrainJob>> {
    if (actor.viewer.kind !== 'node') return fail(new ConflictError('only the node running a job reports on it'));
    const job = await this.reads.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.state !== 'RUNNING')
      return fail(new ConflictError(`the job is ${job.state.toLowerCase()}: a report for it changes nothing`));
    if (job.leaseOwner !== actor.viewer.node.id) return fail(new ConflictError('another node runs this job'));
    return ok(job);
  }

  // Untyped on purpose: an event's level is a plain String in the schema; progressInput takes info, warn or
  // error and refuses anything else, naming the field.
  async report(actor: Actor, id: string, raw: unknown): Promise<Result<TrainJob>> {
    const parsed = parseInput(progressInput, raw, 'input');
    if (!parsed.ok) return parsed;
    const lease = await this.leased(actor, id);
    if (!lease.ok) return lease;
    const { steps, message } = parsed.value;
    const points = parsed.value.points ?? [];
    const events = parsed.value.events ?? [];
    const last = points.at(-1);
    const peak = points.reduce<number | null>((m, p) => (p.peakMiB != null ? Math.max(m ?? 0, p.peakMiB) : m), null);
    const updated = await this.db.$transaction(async (tx) => {
      // Conditional on the lease, so a report racing a cancel, a finish or an expiry changes nothing.
      const n = await tx.trainJob.updateMany({
        where: { id, state: 'RUNNING', leaseOwner: lease.value.leaseOwner },
        data: {
          leaseUntil: this.leaseFrom(this.db.clock.now()),
          ...(steps != null ? { steps } : {}),
          ...(last && last.step >= lease.value.step ? { step: last.step, loss: last.loss } : {}),
          ...(peak != null && peak > (lease.value.peakMiB ?? 0) ? { peakMiB: peak } : {}),
          ...(message && !lease.value.cancelRequestedAt ? { message } : {}),
        },
      });
      if (n.count !== 1) return null;
      if (points.length) {
        // A step reported twice (a retry after a lost answer) is kept once.
        await tx.trainMetric.createMany({
          data: points.map((p) => ({
            jobId: id,
            step: p.step,
            loss: p.loss,
            lr: p.lr ?? null,
            peakMiB: p.peakMiB ?? null,
            tokensPerS: p.tokensPerSecond ?? null,
            evalLoss: p.evalLoss ?? null,
          })),
          skipDuplicates: true,
        });
      }
      if (events.length) {
        await tx.trainEvent.createMany({
          data: events.map((e) => ({ jobId: id, level: e.level, message: e.message })),
        });
      }
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      if (points.length || events.length || steps != null || message) await notify(tx, 'trainJob', id);
      return j;
    });
    return updated ? ok(updated) : fail(new ConflictError('the job ended while the report was on its way'));
  }

  async finish(actor: Actor, id: string, state: string, message: string | null | undefined): Promise<Result<TrainJob>> {
    if (!['DONE', 'FAILED', 'CANCELLED'].includes(state))
      return fail(new ValidationError('state', 'a job finishes DONE, FAILED or CANCELLED'));
    const lease = await this.leased(actor, id);
    if (!lease.ok) return lease;
    const job = lease.value;
    if (state === 'DONE') {
      const peft = await this.db.trainArtifact.findUnique({ where: { jobId_kind: { jobId: id, kind: 'peft' } } });
      if (!peft) return fail(new ConflictError('upload the adapter (PUT …/artifacts/peft) before finishing DONE'));
    }
    const text =
      message?.slice(0, 2000) ??
      (state === 'DONE' ? 'trained' : state === 'CANCELLED' ? 'cancelled; the trainer has exited' : 'failed');
    return this.ledger.end(id, state as 'DONE' | 'FAILED' | 'CANCELLED', text, { leaseOwner: job.leaseOwner }, actor);
  }

  /** Fails a running job from the control plane's side (a refused upload), saying why. */
  async failRunning(id: string, message: string) {
    const job = await this.reads.get(id);
    if (job?.state !== 'RUNNING') return;
    await this.ledger.end(id, 'FAILED', message, { leaseOwner: job.leaseOwner });
  }

  /** Why a queued job has not started, in the operator's words. */
  async waitReason(db: Db | Tx, node: Node, gpuMiB: number, self?: string): Promise<string> {
    if (!this.fleet.isOnline(node))
      return `waiting for node ${node.name}: it is offline${node.lastSeenAt ? ` (last seen ${node.lastSeenAt.toISOString()})` : ' (never seen)'}`;
    const free = largestFreeMiB(node);
    if (free < gpuMiB)
      return `waiting for node ${node.name}: its GPUs report at most ${free} MiB free; the job needs ${gpuMiB} MiB`;
    const busy = await db.trainJob.findFirst({
      where: { leaseOwner: node.id, state: 'RUNNING', ...(self ? { id: { not: self } } : {}) },
    });
    if (busy) return `waiting for node ${node.name}: it is training ${busy.name}`;
    return `waiting for node ${node.name} to start it`;
  }
}

const progressInput = z.object({
  steps: z.number().int().min(0).max(100_000_000).nullish(),
  points: z
    .array(
      z.object({
        step: z.number().int().min(0),
        loss: z.number().refine(Number.isFinite, 'a finite number'),
        lr: z.number().nullish(),
        peakMiB: z.number().int().min(0).nullish(),
        tokensPerSecond: z.number().min(0).nullish(),
        evalLoss: z.number().refine(Number.isFinite, 'a finite number').nullish(),
      }),
    )
    .max(10_000, 'at most 10000 points in one report')
    .nullish(),
  events: z
    .array(z.object({ level: z.enum(['info', 'warn', 'error']), message: z.string().max(4000) }))
    .max(200, 'at most 200 events in one report')
    .nullish(),
  message: z.string().max(2000).nullish(),
});
