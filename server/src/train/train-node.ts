import { z } from 'zod';
import { withState } from '../audit/message.js';
import type { Actor } from '../auth/actor.js';
import type { Db, Tx } from '../db/client.js';
import { isDatabaseUnreachable } from '../db/outage.js';
import type { Node, TrainJob } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { baseFilesFromHub, baseFilesFromMirror } from './base-files.js';
import type { TrainParams } from './params.js';

import { TrainReads, type TrainSpec, type TrainWorkItem } from './train-reads.js';

// The node's side of training (docs/training.md): the work a node's agent sees, its claim of a job, its reports
// under the job's lease, its finish; and the clock that fails the jobs of a node that stopped reporting. Under
// train.service.ts (what people ask) and over train-reads.ts.

export abstract class TrainNodeSide extends TrainReads {
  /** The work a node's agent should see (docs/training.md): its queued jobs that fit now, and its running ones. */
  async work(nodeId: string): Promise<TrainWorkItem[]> {
    const node = await this.db.node.findUnique({ where: { id: nodeId } });
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
    const free = freeMiB(node);
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
    const job = await this.get(id);
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
            await this.event(tx, id, 'error', message);
            await this.changed(tx, await tx.trainJob.findUniqueOrThrow({ where: { id } }));
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
      await this.event(
        tx,
        id,
        'info',
        `claimed by node ${node.name}; base weights from ${files[0]?.url.includes('/mirror/') ? 'the mirror' : 'the registry'}`,
      );
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      await this.changed(tx, j);
      return j;
    });
    if (!claimed) return fail(new ConflictError('another runner claimed the job first'));
    const spec: TrainSpec = {
      id,
      name: claimed.name,
      base_repo: claimed.baseRepo,
      base_revision: claimed.baseRevision,
      params: claimed.params as TrainParams,
      data: { url: this.dataUrl(id), sha256: claimed.dataSha256, bytes: claimed.dataBytes, pairs: claimed.pairs },
      base: { files },
      gguf: claimed.gguf,
    };
    return ok({ job: claimed, spec });
  }

  /** The job, when the calling node holds its lease; otherwise why not (a late or foreign report). */
  protected async leased(actor: Actor, id: string): Promise<Result<TrainJob>> {
    if (actor.viewer.kind !== 'node') return fail(new ConflictError('only the node running a job reports on it'));
    const job = await this.get(id);
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
    return this.end(id, state as 'DONE' | 'FAILED' | 'CANCELLED', text, { leaseOwner: job.leaseOwner }, actor);
  }

  /** Ends a running job, once: the conditional update makes a second end (a duplicate, an expiry) a no-op. */
  protected async end(
    id: string,
    state: 'DONE' | 'FAILED' | 'CANCELLED',
    message: string,
    where: { leaseOwner?: string | null; leaseUntilBefore?: Date },
    actor?: Actor,
    /** The loops' client when the sweep ends it. */
    db: Db = this.db,
  ): Promise<Result<TrainJob>> {
    const out = await db.$transaction(async (tx) => {
      const n = await tx.trainJob.updateMany({
        where: {
          id,
          state: 'RUNNING',
          ...(where.leaseOwner !== undefined ? { leaseOwner: where.leaseOwner } : {}),
          ...(where.leaseUntilBefore ? { leaseUntil: { lt: where.leaseUntilBefore } } : {}),
        },
        data: { state, message, finishedAt: new Date(), leaseOwner: null, leaseUntil: null },
      });
      if (n.count !== 1) return null;
      await this.event(tx, id, state === 'FAILED' ? 'error' : 'info', withState(state, message));
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      if (actor)
        await this.audit.done(tx, actor, {
          action: 'finishTrainJob',
          target: j.name,
          message: `${state}: ${message}`,
          owner: j.owner,
        });
      await this.changed(tx, j);
      return j;
    });
    return out ? ok(out) : fail(new ConflictError('the job has already ended'));
  }

  /** Fails a running job from the control plane's side (a refused upload), saying why. */
  async failRunning(id: string, message: string) {
    const job = await this.get(id);
    if (job?.state !== 'RUNNING') return;
    await this.end(id, 'FAILED', message, { leaseOwner: job.leaseOwner });
  }

  // ─── the clock: lost nodes and why queued jobs wait ────────────────────────

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
  async stop() {
    clearInterval(this.timer);
    await this.tokenizers.dispose();
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
  protected async sweepOnce(now: Date) {
    try {
      const expired = await this.db.loops.trainJob.findMany({
        where: { state: 'RUNNING', leaseUntil: { lt: now } },
        include: { node: true },
      });
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
          await this.end(
            j.id,
            'CANCELLED',
            `cancelled; ${node} stopped reporting for ${secs} s, so whether its trainer has exited is not known`,
            { leaseUntilBefore: now },
            undefined,
            this.db.loops,
          );
        else
          await this.end(
            j.id,
            'FAILED',
            `${node} stopped reporting for ${secs} s (offline, or its agent stopped): the run is lost; submit it again`,
            { leaseUntilBefore: now },
            undefined,
            this.db.loops,
          );
      }
      const queued = await this.db.loops.trainJob.findMany({ where: { state: 'QUEUED' }, include: { node: true } });
      for (const j of queued) {
        const reason = j.node
          ? await this.waitReason(this.db.loops, j.node, j.gpuMiB, j.id)
          : 'its node was removed: delete the job, or submit it for another node';
        if (reason !== j.message) {
          await this.db.loops.$transaction(async (tx) => {
            await tx.trainJob.updateMany({ where: { id: j.id, state: 'QUEUED' }, data: { message: reason } });
            await notify(tx, 'trainJob', j.id);
            if (j.nodeId) await notify(tx, 'trainWork', j.nodeId);
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

  /** Why a queued job has not started, in the operator's words. */
  protected async waitReason(db: Db | Tx, node: Node, gpuMiB: number, self?: string): Promise<string> {
    if (!this.fleet.isOnline(node))
      return `waiting for node ${node.name}: it is offline${node.lastSeenAt ? ` (last seen ${node.lastSeenAt.toISOString()})` : ' (never seen)'}`;
    const free = freeMiB(node);
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

/** The most free memory on one of the node's GPUs: a job needs its memory on one card (placement sums them). */
function freeMiB(node: Node): number {
  const gpus = Array.isArray(node.gpus) ? (node.gpus as { freeMiB?: number }[]) : [];
  return gpus.reduce((m, g) => Math.max(m, Number(g.freeMiB ?? 0)), 0);
}
