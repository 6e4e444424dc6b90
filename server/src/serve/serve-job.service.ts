import { randomUUID } from 'node:crypto';
import type { Logger } from '@hangar/common/log';
import { sleep, waitUntil } from '@hangar/common/retry';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, systemActor } from '../auth/actor.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Db } from '../db/client.js';
import { LeaseQueue } from '../db/lease.js';
import { isDatabaseUnreachable, LoopHealth, Stopped } from '../db/outage.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { Prisma, type ServeJob, type ServeJobStep } from '../generated/prisma/client.js';
import { fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { notify } from '../pubsub.js';
import type { RegistryService } from '../registry/registry.service.js';
import {
  type Detail,
  Interrupted,
  STEP_HANDLERS,
  STEPS,
  type Step,
  type StepDone,
  StepFailed,
  StopEarly,
} from './serve-job-steps.js';

// Serving a model from the registry in one step, as a job kept in PostgreSQL so a download of hours does not
// depend on the caller staying connected, and a server restart picks it up where it was. The steps themselves are
// in serve-job-steps.ts; this file queues jobs, leases them to one replica and runs their steps in order.

export { STEPS } from './serve-job-steps.js';

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

/** A job is held by one replica at a time; one whose replica went away is taken up 30 s after its last renewal. */
const jobLeases = new LeaseQueue({ table: 'ServeJob', leaseMs: 30_000, touchColumn: 'updatedAt' });

export type ServeJobDeps = {
  db: Db;
  audit: AuditService;
  registry: RegistryService;
  mirror: MirrorService;
  catalog: CatalogService;
  log: Logger;
  /** How often an idle runner looks for a queued job (1 s). */
  pollMs?: number;
  /** Runs the smoke step's request through the replica's endpoint; none, the smoke step fails (it cannot reach one). */
  fleet?: Pick<FleetService, 'smokeReplica'>;
};

export class ServeJobService {
  private readonly owner = `${process.pid}-${randomUUID().slice(0, 8)}`;
  private running = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly active = new Set<string>();
  /** The runner's view of the database: jobs pause (never fail) while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(private readonly deps: ServeJobDeps) {
    this.health = new LoopHealth('serve jobs', deps.log);
  }

  get(id: string) {
    return z.string().uuid().safeParse(id).success
      ? this.deps.db.serveJob.findUnique({ where: { id }, include: { steps: { orderBy: { position: 'asc' } } } })
      : null;
  }

  async create(actor: Actor, raw: z.input<typeof input>): Promise<Result<ServeJob & { steps: ServeJobStep[] }>> {
    const parsed = parseInput(input, raw, '');
    if (!parsed.ok) return parsed;
    const { repo, file, onDemand } = parsed.value;
    // No quantisation and no file: the registry step takes the best set that fits (serve-job-steps.ts bestSet).
    const quant = file ? null : (parsed.value.quant?.toUpperCase() ?? null);
    const job = await this.deps.db.$transaction(async (tx) => {
      const created = await tx.serveJob.create({
        data: {
          repo,
          quant,
          file: file ?? null,
          onDemand: Boolean(onDemand),
          createdBy: actor.viewer.kind === 'user' || actor.viewer.kind === 'token' ? actor.viewer.user.email : null,
          steps: { create: STEPS.map((name, position) => ({ name, position })) },
        },
        include: { steps: { orderBy: { position: 'asc' } } },
      });
      await this.deps.audit.done(tx, actor, {
        action: 'serveFromRegistry',
        target: repo,
        message: `${file ?? quant ?? 'the best set that fits'}${onDemand ? ', on demand' : ''}: job ${created.id}`,
      });
      return created;
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
    await waitUntil(() => this.active.size === 0, { timeoutMs: 5000, pollMs: 20 });
  }

  private kick() {
    if (!this.running || !this.health.due()) return;
    // The claim and the job it starts (its lease renewals, its steps' own rows, and the reads and writes the steps
    // make themselves) are on the loops' connections (db.loops). What a step asks of the registry, the mirror and
    // the catalog goes through those services, as an operator's mutation would. Its log lines name the job
    // (`job`), never the request that created it and woke the loop: that id is on the job's audit rows.
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
        this.deps.log.error('serve job runner failed', { error: err });
      });
  }

  /** A job nobody holds (new, or its holder's lease ran out: a restart), taken atomically. */
  private async claim(): Promise<ServeJob | null> {
    const claimed = await jobLeases.claim(this.deps.db.loops, this.owner, {
      claimable: Prisma.sql`state = 'QUEUED' OR (state = 'RUNNING' AND ${jobLeases.expired({ orNone: true })})`,
      order: Prisma.sql`"createdAt"`,
      set: Prisma.sql`state = 'RUNNING'`,
    });
    return claimed ? this.deps.db.loops.serveJob.findUnique({ where: { id: claimed.id } }) : null;
  }

  /**
   * Runs a claimed job to its end. The database going away under a step fails nothing: the job waits for it and
   * then goes on at the step it was on (each step is safe to run again), if it is still this replica's.
   */
  private async run(job: ServeJob) {
    const renew = setInterval(() => {
      jobLeases.renew(this.deps.db.loops, job.id, this.owner).catch((err) => {
        if (!this.health.failed(err))
          this.deps.log.warn("could not renew a serve job's lease", { job: job.id, error: err });
      });
    }, jobLeases.leaseMs / 3);
    try {
      for (;;) {
        try {
          return await this.runSteps(job);
        } catch (err) {
          if (!this.health.failed(err)) throw err;
        }
        const stillOurs = await this.health.until(
          () => jobLeases.renew(this.deps.db.loops, job.id, this.owner, Prisma.sql`state = 'RUNNING'`),
          () => !this.running,
        );
        if (!stillOurs) return; // taken over by another replica after its lease ran out
        this.deps.log.info('serve job goes on now that the database answers', { job: job.id });
      }
    } catch (err) {
      if (!(err instanceof Stopped)) throw err;
      // Stopping while the database is away: the lease cannot be released; it runs out and the job resumes then.
      this.deps.log.info('serve job interrupted by shutdown; it resumes at the next start', { job: job.id });
    } finally {
      clearInterval(renew);
    }
  }

  private async runSteps(job: ServeJob) {
    try {
      const steps = await this.deps.db.loops.serveJobStep.findMany({
        where: { jobId: job.id },
        orderBy: { position: 'asc' },
      });
      let detail: Detail = {};
      for (const step of steps)
        if (step.detail && typeof step.detail === 'object') detail = { ...detail, ...(step.detail as Detail) };
      for (const step of steps) {
        if (step.state === 'DONE') continue;
        if (!this.running) throw new Interrupted();
        const name = step.name as Step;
        await this.setStep(job.id, name, { state: 'RUNNING', startedAt: step.startedAt ?? new Date() });
        try {
          const { message, more } = await this.runStep(job, name, detail);
          detail = { ...detail, ...more };
          await this.setStep(job.id, name, { state: 'DONE', message, detail: more, finishedAt: new Date() });
        } catch (err) {
          // An outage is not the step's failure: run() waits for the database and runs the step again.
          if (err instanceof Interrupted || isDatabaseUnreachable(err)) throw err;
          if (err instanceof StopEarly) {
            await this.setStep(job.id, name, { state: 'DONE', message: err.message, finishedAt: new Date() });
            await this.finish(job.id, 'DONE', err.message);
            return;
          }
          const message = err instanceof StepFailed ? err.message : `unexpected: ${(err as Error).message}`;
          if (!(err instanceof StepFailed))
            this.deps.log.error('serve job step crashed', { job: job.id, step: name, error: err });
          await this.setStep(job.id, name, { state: 'FAILED', message, finishedAt: new Date() });
          await this.finish(job.id, 'FAILED', `${name}: ${message}`);
          return;
        }
      }
      const smoke = await this.deps.db.loops.serveJobStep.findFirst({ where: { jobId: job.id, name: 'smoke' } });
      await this.finish(job.id, 'DONE', smoke?.message ?? 'serving');
    } catch (err) {
      if (!(err instanceof Interrupted)) throw err;
      // Released rather than left to expire: the next start takes it up at once, at the step it was on.
      await jobLeases.release(this.deps.db.loops, job.id, this.owner).catch(() => {}); // the database is away too: the lease runs out instead
      this.deps.log.info('serve job interrupted by shutdown; it resumes at the next start', { job: job.id });
    }
  }

  /** One step of the job, by its handler in the table; an error it throws ends the step (see runSteps). */
  private runStep(job: ServeJob, name: Step, detail: Detail): Promise<StepDone> {
    return STEP_HANDLERS[name]({
      job,
      detail,
      db: this.deps.db.loops,
      registry: this.deps.registry,
      mirror: this.deps.mirror,
      catalog: this.deps.catalog,
      fleet: this.deps.fleet,
      asJob: this.jobActor(job),
      progress: (message) => this.progress(job.id, name, message),
      pause: () => this.pause(),
    });
  }

  private async pause() {
    await sleep(this.deps.pollMs ?? 1000);
    if (!this.running) throw new Interrupted();
  }

  /** The job's own changes (the fetch, the catalog entry) are audited as the job's, naming who started it. */
  private jobActor(job: ServeJob): Actor {
    return systemActor(`serve job ${job.id}${job.createdBy ? ` for ${job.createdBy}` : ''}`, `job-${job.id}`);
  }

  private async setStep(
    jobId: string,
    name: Step,
    data: Partial<Pick<ServeJobStep, 'state' | 'message' | 'startedAt' | 'finishedAt'>> & { detail?: Detail },
  ) {
    await this.deps.db.loops.$transaction(async (tx) => {
      await tx.serveJobStep.update({
        where: { jobId_name: { jobId, name } },
        data: { ...data, detail: data.detail ?? undefined },
      });
      await notify(tx, 'serveJob', jobId);
    });
  }

  private async progress(jobId: string, name: Step, message: string) {
    await this.deps.db.loops.serveJobStep.update({ where: { jobId_name: { jobId, name } }, data: { message } });
    await notify(this.deps.db.loops, 'serveJob', jobId);
  }

  private async finish(id: string, state: 'DONE' | 'FAILED', message: string) {
    await this.deps.db.loops.$transaction(async (tx) => {
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
