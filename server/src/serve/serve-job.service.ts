import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Context } from '../context.js';
import { asLoop, type Db } from '../db/client.js';
import { isDatabaseUnreachable, LoopHealth, Stopped } from '../db/outage.js';
import type { FleetService } from '../fleet/fleet.service.js';
import type { ServeJob, ServeJobStep } from '../generated/prisma/client.js';
import { fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { parseInput } from '../lib/validate.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { notify } from '../pubsub.js';
import type { RegistryService } from '../registry/registry.service.js';

// Serving a model from the registry in one step, as a job kept in PostgreSQL so a download of hours does not
// depend on the caller staying connected, and a server restart picks it up where it was. Each step is written
// so that running it again after a restart does no harm.

export const STEPS = ['registry', 'mirror', 'check', 'catalog', 'replica', 'smoke'] as const;
type Step = (typeof STEPS)[number];

const input = z.object({
  repo: z
    .string()
    .trim()
    .regex(
      /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/,
      'a repository is owner/name, such as Qwen/Qwen3-8B-GGUF',
    ),
  quant: z
    .string()
    .trim()
    .regex(/^[A-Za-z0-9_-]{1,40}$/, 'a quantisation such as Q4_K_M')
    .nullish(),
  file: z.string().trim().min(1).max(300).nullish(),
  onDemand: z.boolean().nullish(),
});

class StepFailed extends Error {}
class StopEarly extends Error {}
/** The server is stopping: the job is left for the next start (or another replica) to pick up. */
class Interrupted extends Error {}

type Detail = { set?: string; revision?: string; model?: string; version?: string; name?: string };

const LEASE_MS = 30_000;
const REPLICA_PATIENCE_MS = 15 * 60_000;
/** How long a replica may wait for a node with room before the job says so and stops. */
const UNPLACED_PATIENCE_MS = 5_000;

export class ServeJobService {
  private readonly owner = `${process.pid}-${randomUUID().slice(0, 8)}`;
  private running = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly active = new Set<string>();
  /** The runner's view of the database: jobs pause (never fail) while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
    private readonly registry: RegistryService,
    private readonly mirror: MirrorService,
    private readonly catalog: CatalogService,
    private readonly log: Logger,
    private readonly pollMs = 1000,
    /** Runs the smoke step's request through the replica's endpoint. */
    private readonly fleet?: Pick<FleetService, 'smokeReplica'>,
  ) {
    this.health = new LoopHealth('serve jobs', log);
  }

  get(id: string) {
    return z.string().uuid().safeParse(id).success
      ? this.db.serveJob.findUnique({ where: { id }, include: { steps: { orderBy: { position: 'asc' } } } })
      : null;
  }

  async create(ctx: Context, raw: unknown): Promise<Result<ServeJob & { steps: ServeJobStep[] }>> {
    const parsed = parseInput(input, raw, '');
    if (!parsed.ok) return parsed;
    const { repo, file, onDemand } = parsed.value;
    const quant = file ? null : (parsed.value.quant ?? 'Q4_K_M').toUpperCase();
    const job = await this.db.$transaction(async (tx) => {
      const j = await tx.serveJob.create({
        data: {
          repo,
          quant,
          file: file ?? null,
          onDemand: Boolean(onDemand),
          createdBy: ctx.viewer.kind === 'user' || ctx.viewer.kind === 'token' ? ctx.viewer.user.email : null,
          steps: { create: STEPS.map((name, position) => ({ name, position })) },
        },
        include: { steps: { orderBy: { position: 'asc' } } },
      });
      await this.audit.done(tx, ctx, {
        action: 'serveFromRegistry',
        target: repo,
        message: `${file ?? quant}${onDemand ? ', on demand' : ''}: job ${j.id}`,
      });
      return j;
    });
    this.kick();
    return ok(job);
  }

  start() {
    this.running = true;
    this.timer = setInterval(() => this.kick(), 2000);
    this.kick();
  }

  async stop() {
    this.running = false;
    clearInterval(this.timer);
    const deadline = Date.now() + 5000;
    while (this.active.size && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  }

  private kick() {
    if (!this.running || !this.health.due()) return;
    // The claim and the job it starts (its steps, its lease renewals) run on the loops' connections.
    asLoop(() => {
      void this.claim()
        .then((job) => {
          this.health.ok();
          if (!job) return;
          this.active.add(job.id);
          return this.run(job).finally(() => {
            this.active.delete(job.id);
            this.kick();
          });
        })
        .catch((err) => {
          if (err instanceof Stopped || this.health.failed(err)) return;
          this.log.error('serve job runner failed', { error: err });
        });
    });
  }

  /** A job nobody holds (new, or its holder's lease ran out: a restart), taken atomically. */
  private async claim(): Promise<ServeJob | null> {
    const rows = await this.db.$queryRaw<{ id: string }[]>`
      UPDATE "ServeJob" SET state = 'RUNNING', "leaseOwner" = ${this.owner}, "leaseUntil" = now() + ${`${LEASE_MS} milliseconds`}::interval, "updatedAt" = now()
      WHERE id = (SELECT id FROM "ServeJob" WHERE state = 'QUEUED' OR (state = 'RUNNING' AND ("leaseUntil" IS NULL OR "leaseUntil" < now()))
                  ORDER BY "createdAt" LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING id`;
    const id = rows[0]?.id;
    return id ? this.db.serveJob.findUnique({ where: { id } }) : null;
  }

  /**
   * Runs a claimed job to its end. The database going away under a step fails nothing: the job waits for it and
   * then goes on at the step it was on (each step is safe to run again), if it is still this replica's.
   */
  private async run(job: ServeJob) {
    const renew = setInterval(() => {
      this.db.serveJob
        .updateMany({
          where: { id: job.id, leaseOwner: this.owner },
          data: { leaseUntil: new Date(Date.now() + LEASE_MS) },
        })
        .catch((err) => {
          if (!this.health.failed(err))
            this.log.warn("could not renew a serve job's lease", { job: job.id, error: err });
        });
    }, LEASE_MS / 3);
    try {
      for (;;) {
        try {
          return await this.runSteps(job);
        } catch (err) {
          if (!this.health.failed(err)) throw err;
        }
        const held = await this.health.until(
          () =>
            this.db.serveJob.updateMany({
              where: { id: job.id, leaseOwner: this.owner, state: 'RUNNING' },
              data: { leaseUntil: new Date(Date.now() + LEASE_MS) },
            }),
          () => !this.running,
        );
        if (held.count === 0) return; // taken over by another replica after its lease ran out
        this.log.info('serve job goes on now that the database answers', { job: job.id });
      }
    } catch (err) {
      if (!(err instanceof Stopped)) throw err;
      // Stopping while the database is away: the lease cannot be released; it runs out and the job resumes then.
      this.log.info('serve job interrupted by shutdown; it resumes at the next start', { job: job.id });
    } finally {
      clearInterval(renew);
    }
  }

  private async runSteps(job: ServeJob) {
    try {
      const steps = await this.db.serveJobStep.findMany({ where: { jobId: job.id }, orderBy: { position: 'asc' } });
      let detail: Detail = {};
      for (const s of steps)
        if (s.detail && typeof s.detail === 'object') detail = { ...detail, ...(s.detail as Detail) };
      for (const s of steps) {
        if (s.state === 'DONE') continue;
        if (!this.running) throw new Interrupted();
        await this.setStep(job.id, s.name as Step, { state: 'RUNNING', startedAt: s.startedAt ?? new Date() });
        try {
          const { message, more } = await this.step(job, s.name as Step, detail);
          detail = { ...detail, ...more };
          await this.setStep(job.id, s.name as Step, { state: 'DONE', message, detail: more, finishedAt: new Date() });
        } catch (err) {
          // An outage is not the step's failure: run() waits for the database and runs the step again.
          if (err instanceof Interrupted || isDatabaseUnreachable(err)) throw err;
          if (err instanceof StopEarly) {
            await this.setStep(job.id, s.name as Step, { state: 'DONE', message: err.message, finishedAt: new Date() });
            await this.finish(job.id, 'DONE', err.message);
            return;
          }
          const message = err instanceof StepFailed ? err.message : `unexpected: ${(err as Error).message}`;
          if (!(err instanceof StepFailed))
            this.log.error('serve job step crashed', { job: job.id, step: s.name, error: err });
          await this.setStep(job.id, s.name as Step, { state: 'FAILED', message, finishedAt: new Date() });
          await this.finish(job.id, 'FAILED', `${s.name}: ${message}`);
          return;
        }
      }
      const smoke = await this.db.serveJobStep.findFirst({ where: { jobId: job.id, name: 'smoke' } });
      await this.finish(job.id, 'DONE', smoke?.message ?? 'serving');
    } catch (err) {
      if (!(err instanceof Interrupted)) throw err;
      // Released rather than left to expire: the next start takes it up at once, at the step it was on.
      await this.db.serveJob
        .updateMany({
          where: { id: job.id, leaseOwner: this.owner },
          data: { leaseOwner: null, leaseUntil: null },
        })
        .catch(() => {}); // the database is away too: the lease runs out instead
      this.log.info('serve job interrupted by shutdown; it resumes at the next start', { job: job.id });
    }
  }

  private async step(job: ServeJob, name: Step, d: Detail): Promise<{ message: string; more: Detail }> {
    switch (name) {
      case 'registry': {
        const opened = await this.registry.repo({ id: job.repo });
        if (!opened.ok) throw new StepFailed(opened.error.message);
        const repo = opened.value;
        if (repo.noAccess) throw new StepFailed(repo.noAccess);
        const models = repo.sets.filter((s) => s.kind === 'MODEL' && s.format === 'GGUF');
        const set = job.file
          ? repo.sets.find((s) => s.files.some((f) => f.path === job.file))
          : models.find((s) => s.quant === job.quant);
        if (!set) {
          const has = models
            .map((s) => (s.shardCount > 1 ? `${s.quant ?? s.id} (${s.shardCount} shards)` : (s.quant ?? s.id)))
            .join(', ');
          throw new StepFailed(
            `${job.repo} has no ${job.file ?? `${job.quant} set`}; it has ${has || 'no GGUF model sets'}`,
          );
        }
        if (!set.verdict.servable) throw new StepFailed(`${set.id}: ${set.verdict.reason}`);
        return {
          message: `${set.id}: ${set.files.length} file(s), ${set.totalBytes} bytes at ${repo.shortRevision}`,
          more: { set: set.id, revision: repo.revision, model: set.model, version: set.version, name: set.model },
        };
      }
      case 'mirror': {
        const { model = '', version = '' } = d;
        const existing = await this.mirror.version(model, version);
        if (!existing || existing.state === 'FAILED' || existing.state === 'CANCELLED') {
          const started = await this.registry.fetchSet(this.systemCtx(job), {
            repo: job.repo,
            revision: d.revision,
            set: d.set ?? '',
            model,
            version,
          });
          if (!started.ok) throw new StepFailed(started.error.message);
          if (existing && existing.state !== 'PRESENT')
            await this.mirror.retry(this.systemCtx(job), { model, version }).catch(() => {});
        }
        for (;;) {
          const v = await this.mirror.version(model, version);
          if (!v) throw new StepFailed(`${model}/${version} left the mirror while arriving`);
          if (v.state === 'PRESENT') return { message: `${model}/${version} present and verified`, more: {} };
          if (v.state === 'FAILED' || v.state === 'CANCELLED')
            throw new StepFailed(v.files.find((f) => f.error)?.error ?? `the fetch ended ${v.state.toLowerCase()}`);
          await this.progress(job.id, 'mirror', `${v.progress.bytesDone} of ${v.progress.bytesTotal ?? '?'} bytes`);
          await this.pause();
        }
      }
      case 'check': {
        const plan = await this.catalog.plan({ model: d.model ?? '', version: d.version ?? '', name: d.name });
        if (!plan.ok) throw new StepFailed(plan.error.message);
        if (plan.value.verdict && !plan.value.verdict.servable) throw new StepFailed(plan.value.verdict.reason);
        const gib = plan.value.memory ? (plan.value.memory.totalBytes / 2 ** 30).toFixed(1) : '?';
        const fits = plan.value.fitsOn.filter((f) => f.fits).map((f) => f.node);
        return {
          message: `${plan.value.architecture}: needs ${gib} GiB at ${plan.value.memory?.context} tokens; fits on ${fits.join(', ') || 'no node now'}`,
          more: {},
        };
      }
      case 'catalog': {
        const name = d.name ?? d.model ?? '';
        const existing = await this.catalog.get(name);
        if (existing) {
          // After a restart, this step may already have run: the entry it made is the one wanted.
          if (existing.source.includes(`/mirror/${d.model}/${d.version}/`))
            return { message: `${name} is in the catalog`, more: {} };
          throw new StepFailed(`the catalog already has a model named ${name} serving something else`);
        }
        const placed = await this.catalog.serveMirrorVersion(this.systemCtx(job), {
          model: d.model ?? '',
          version: d.version ?? '',
          name,
          mode: job.onDemand ? 'ON_DEMAND' : 'ALWAYS',
        });
        if (!placed.ok) throw new StepFailed(placed.error.message);
        return { message: placed.value.message, more: {} };
      }
      case 'replica': {
        if (job.onDemand)
          throw new StopEarly(`${d.name} is on demand: no replica runs until it is asked for (wakeModel)`);
        const deadline = Date.now() + REPLICA_PATIENCE_MS;
        let unplacedSince: number | null = null;
        for (;;) {
          const model = await this.db.catalogModel.findUnique({
            where: { name: d.name ?? '' },
            include: { replicas: { include: { node: true } } },
          });
          if (!model) throw new StepFailed(`${d.name} left the catalog`);
          if (model.maxReplicas === 0) throw new StopEarly(`${d.name} was stopped (parked): no replica will start`);
          const ready = model.replicas.find((r) => r.state === 'READY');
          if (ready) return { message: `ready on ${ready.node?.name}`, more: {} };
          const failed = model.replicas.find((r) => r.state === 'FAILED');
          if (failed)
            throw new StepFailed(
              `the replica failed on ${failed.node?.name ?? 'its node'}: ${failed.message ?? 'no reason given'}`,
            );
          const unplaced = model.replicas.find((r) => r.state === 'PENDING' && !r.nodeId);
          if (unplaced) {
            unplacedSince ??= Date.now();
            if (Date.now() - unplacedSince > UNPLACED_PATIENCE_MS)
              throw new StepFailed(unplaced.message ?? 'no node can take it');
          } else unplacedSince = null;
          const waiting = model.replicas.find((r) => r.state === 'LOADING' || r.state === 'PENDING');
          await this.progress(
            job.id,
            'replica',
            waiting
              ? `${waiting.state.toLowerCase()} on ${waiting.node?.name ?? '—'}${waiting.message ? `: ${waiting.message}` : ''}`
              : 'waiting for placement',
          );
          if (Date.now() > deadline) throw new StepFailed('no replica became ready in 15 minutes');
          await this.pause();
        }
      }
      case 'smoke': {
        const model = await this.db.catalogModel.findUnique({
          where: { name: d.name ?? '' },
          include: { replicas: true },
        });
        const ready = model?.replicas.find((r) => r.state === 'READY');
        if (!ready) throw new StepFailed(`${d.name} has no ready replica any more`);
        if (!this.fleet) throw new StepFailed('this server cannot reach replicas');
        // A request of its own through the replica's endpoint with its engine key, as the gateway will send one:
        // the job ends DONE only when the model it made answers.
        const smoke = await this.fleet.smokeReplica(ready.id);
        if (!smoke.ok) throw new StepFailed(smoke.reason);
        return {
          message: `answered ${JSON.stringify(smoke.text)} at ${smoke.tokensPerSecond.toFixed(1)} tokens/s, first token in ${Math.round(smoke.timeToFirstTokenMs)} ms`,
          more: {},
        };
      }
    }
  }

  private async pause() {
    await sleep(this.pollMs);
    if (!this.running) throw new Interrupted();
  }

  /** The job's own changes (the fetch, the catalog entry) are audited as the job's, naming who started it. */
  private systemCtx(job: ServeJob): Context {
    return {
      viewer: { kind: 'system', name: `serve job ${job.id}${job.createdBy ? ` for ${job.createdBy}` : ''}` },
      requestId: `job-${job.id}`,
    } as unknown as Context;
  }

  private async setStep(
    jobId: string,
    name: Step,
    data: Partial<Pick<ServeJobStep, 'state' | 'message' | 'startedAt' | 'finishedAt'>> & { detail?: Detail },
  ) {
    await this.db.$transaction(async (tx) => {
      await tx.serveJobStep.update({
        where: { jobId_name: { jobId, name } },
        data: { ...data, detail: data.detail ?? undefined },
      });
      await notify(tx, 'serveJob', jobId);
    });
  }

  private async progress(jobId: string, name: Step, message: string) {
    await this.db.serveJobStep.update({ where: { jobId_name: { jobId, name } }, data: { message } });
    await notify(this.db, 'serveJob', jobId);
  }

  private async finish(id: string, state: 'DONE' | 'FAILED', message: string) {
    await this.db.$transaction(async (tx) => {
      await tx.serveJob.update({
        where: { id },
        data: { state, message, finishedAt: new Date(), leaseOwner: null, leaseUntil: null },
      });
      await notify(tx, 'serveJob', id);
    });
  }

  notFound(id: string) {
    return fail(new NotFoundError(`no serve job ${id}`));
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
