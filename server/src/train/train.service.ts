import fs from 'node:fs/promises';
import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, describeActor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import { modelByName, nameTaken } from '../catalog/catalog-store.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import type { FleetService } from '../fleet/fleet.service.js';
import { nodeByName } from '../fleet/fleet-store.js';
import { largestCard } from '../fleet/node-inventory.js';
import type { TrainJob } from '../generated/prisma/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { lockOrgTree, sees } from '../org/org.service.js';
import { notify } from '../pubsub.js';
import type { RegistryService } from '../registry/registry.service.js';
import { baseFilesFromHub, baseFilesFromMirror } from './base-files.js';
import { checkTrainData, TRAIN_MAX_DATA_BYTES } from './data.js';
import { chooseHeldOut, evalInputFields } from './eval-job.js';
import { TrainEvaluations } from './eval-store.js';
import type { OwnerRules } from './owner.js';
import { parseParams } from './params.js';
import { SiteGeneralQuestions } from './site-questions.js';
import type { TrainLedger } from './train-ledger.js';
import { TrainNodeSide } from './train-node.js';
import { ENDED, ended, TrainReads } from './train-reads.js';
import { TrainSweep } from './train-sweep.js';

// Training jobs: the rules of DESIGN.md §5 "Train" and docs/training.md. Every state change is one transaction
// that also records an event and queues the NOTIFY, so the console, scripts and the node's agent all read the
// same truth, and a server restart loses nothing: the job's state is the database's.
// This file holds what people ask (submit, cancel, remove) and composes the parts the rest of the server calls
// through it: the reads (train-reads.ts), the node's protocol (train-node.ts), the clock (train-sweep.ts) and the
// ledger every change is written through (train-ledger.ts), each given what it needs and nothing more.

export type { TrainSpec, TrainWorkItem } from './train-reads.js';

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;
const REPO = /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/;

const createInput = z.object({
  name: z.string().trim(),
  model: z.string().trim().min(1, 'the catalog model the adapter is for'),
  baseRepo: z.string().trim(),
  baseRevision: z
    .string()
    .trim()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$/, 'a branch, a tag or a commit hash')
    .nullish(),
  node: z.string().trim().min(1, 'the node that trains it, by name'),
  gpuMiB: z
    .number()
    .int('a whole number of MiB')
    .min(1, 'the GPU memory the job needs, in MiB: more than 0')
    .max(16_777_216, 'at most 16777216 MiB'),
  owner: z.string().trim().nullish(),
  public: z.boolean().nullish(),
  data: z.string().nullish(),
  dataSha256: z
    .string()
    .regex(/^[0-9a-f]{64}$/, 'the sha256 POST /api/train/data answered with')
    .nullish(),
  params: z.unknown().optional(),
  gguf: z.boolean().nullish(),
  ...evalInputFields,
});

export type TrainServiceDeps = {
  db: Db;
  audit: AuditService;
  config: Config;
  fleet: Pick<FleetService, 'isOnline'>;
  mirror: MirrorService;
  registry: RegistryService;
  owners: OwnerRules;
  log: Logger;
  /** Built before the fleet, which fails a removed node's jobs through it (app-services.ts). */
  ledger: TrainLedger;
};

export class TrainService {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly mirror: MirrorService;
  private readonly registry: RegistryService;
  private readonly owners: OwnerRules;
  private readonly ledger: TrainLedger;
  private readonly reads: TrainReads;
  private readonly node: TrainNodeSide;
  private readonly sweeper: TrainSweep;
  /** Each job's evaluation against its base, and the gate it puts on publishing (eval-store.ts). */
  readonly evaluations: TrainEvaluations;
  /** The general questions evaluations ask to catch forgetting; hangar.yaml's, loaded at start (app.ts). */
  readonly generalQuestions = new SiteGeneralQuestions();

  constructor(deps: TrainServiceDeps) {
    this.db = deps.db;
    this.audit = deps.audit;
    this.mirror = deps.mirror;
    this.registry = deps.registry;
    this.owners = deps.owners;
    this.ledger = deps.ledger;
    this.reads = new TrainReads(deps);
    this.node = new TrainNodeSide({ ...deps, reads: this.reads, general: this.generalQuestions });
    this.sweeper = new TrainSweep({ ...deps, node: this.node });
    this.evaluations = new TrainEvaluations({ ...deps, reads: this.reads });
  }

  // ─── what other domains, the routes and the schema call, answered by the parts ──

  readonly get = (id: string) => this.reads.get(id);
  readonly visible = (actor: Actor, id: string) => this.reads.visible(actor, id);
  readonly mayReadData = (viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>) =>
    this.reads.mayReadData(viewer, job);
  readonly mayReadArtifacts = (viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>) =>
    this.reads.mayReadArtifacts(viewer, job);
  readonly page = (...args: Parameters<TrainReads['page']>) => this.reads.page(...args);
  readonly check = (...args: Parameters<TrainReads['check']>) => this.reads.check(...args);
  readonly storeData = (...args: Parameters<TrainReads['storeData']>) => this.reads.storeData(...args);
  readonly setBaseUrl = (get: () => string) => this.reads.setBaseUrl(get);
  readonly jobDir = (id: string) => this.reads.jobDir(id);
  /** Where the pairs and artifacts are kept: the data dir, or the mirror's bucket (train-files.ts). */
  get files() {
    return this.reads.files;
  }

  readonly work = (nodeId: string) => this.node.work(nodeId);
  readonly claim = (actor: Actor, id: string) => this.node.claim(actor, id);
  readonly report = (actor: Actor, id: string, raw: unknown) => this.node.report(actor, id, raw);
  readonly finish = (...args: Parameters<TrainNodeSide['finish']>) => this.node.finish(...args);
  readonly failRunning = (id: string, message: string) => this.node.failRunning(id, message);

  readonly event = (...args: Parameters<TrainLedger['event']>) => this.ledger.event(...args);

  get health() {
    return this.sweeper.health;
  }
  readonly start = (everyMs?: number) => this.sweeper.start(everyMs);
  readonly sweep = (now?: Date) => this.sweeper.sweep(now);
  async stop() {
    this.sweeper.stop();
    await this.reads.dispose();
  }

  // ─── submitting ────────────────────────────────────────────────────────────

  async create(actor: Actor, raw: z.input<typeof createInput>): Promise<Result<TrainJob>> {
    const parsed = parseInput(createInput, raw, '');
    if (!parsed.ok) return parsed;
    const input = parsed.value;
    const refuse = (field: string, message: string) => fail(new ValidationError(field, message));

    if (!NAME.test(input.name))
      return refuse(
        'name',
        `an adapter's name is letters, digits, ".", "_" and "-", up to 100, starting with a letter or digit: ${JSON.stringify(input.name)} is not`,
      );
    const model = await modelByName(this.db, input.model);
    // A model the actor may not call reads as none, in the same words (org-owners.ts `sees`).
    if (!model || !sees(await this.owners.sightOf(actor.viewer), model.owner))
      return refuse(
        'model',
        `no model ${input.model} in the catalog: an adapter is trained for a model the fleet serves`,
      );
    if (await nameTaken(this.db, input.name))
      return refuse(
        'name',
        `${input.name} is already a model's or an adapter's name: requests ask for an adapter by its name, so it must be unique`,
      );
    if (!REPO.test(input.baseRepo))
      return refuse(
        'baseRepo',
        `base_repo is the base weights' registry repository, owner/name (such as Qwen/Qwen2.5-0.5B-Instruct): ${JSON.stringify(input.baseRepo)} is not`,
      );
    if (/gguf/i.test(input.baseRepo))
      return refuse(
        'baseRepo',
        `${input.baseRepo} looks like a GGUF repository: training needs the model's safetensors weights (the repository the GGUF was converted from)`,
      );
    const node = await nodeByName(this.db, input.node);
    if (!node) return refuse('node', `no node ${input.node}: name a node that reports to Hangar (see Nodes)`);
    // A job trains on one GPU (the agent gives the trainer one card): more than the node's largest card would
    // wait in the queue forever. A node that has not reported its GPUs yet cannot be judged, and is trusted.
    const largest = largestCard(node);
    if (largest && input.gpuMiB > largest.totalMiB)
      return refuse(
        'gpuMiB',
        `the job asks for ${input.gpuMiB} MiB of GPU memory, more than node ${node.name} could ever give it: its largest card is GPU ${largest.index} (${largest.name}) with ${largest.totalMiB} MiB. Ask for at most ${largest.totalMiB} MiB, or name a node with a larger card`,
      );

    // The pairs: inline (small, from scripts) or uploaded first with POST /api/train/data (the console, big files).
    if (Boolean(input.data) === Boolean(input.dataSha256))
      return refuse(
        'data',
        'give the pairs either inline (data: NDJSON of {"q","a"}) or as dataSha256 from POST /api/train/data',
      );
    let text: string;
    if (input.data) text = input.data;
    else {
      // A job's dataSha256 is shown to every viewer: without this, anyone could name an owned job's pairs as
      // their own job's data and read them back. Refused in the words of a missing upload, so it tells nothing.
      const ownedBy = await this.db.trainJob.findMany({
        where: { dataSha256: input.dataSha256 as string, owner: { not: null } },
        select: { owner: true },
        distinct: ['owner'],
      });
      let mayUse = true;
      for (const o of ownedBy) if (!(await this.owners.mayRead(actor.viewer, o.owner))) mayUse = false;
      const stored = mayUse ? await this.reads.readData(input.dataSha256 as string) : null;
      if (stored === null)
        return refuse(
          'dataSha256',
          `no uploaded data has sha256 ${input.dataSha256}: upload it with POST /api/train/data first`,
        );
      text = stored;
    }
    const report = checkTrainData(text);
    const field = input.data ? 'data' : 'dataSha256';
    if (report.bytes > TRAIN_MAX_DATA_BYTES) return refuse(field, report.errors[0]?.message ?? 'the data is too large');
    const bad = report.errors[0];
    if (bad)
      return refuse(
        field,
        `line ${bad.line}: ${bad.message}${report.errorCount > 1 ? ` (and ${report.errorCount - 1} more lines)` : ''}`,
      );
    if (report.pairs === 0)
      return refuse(field, 'the data holds no pairs: NDJSON of {"q": "…", "a": "…"}, one per line');

    const params = parseParams(input.params);
    if (!params.ok) return params;

    const owner = await this.ownerFor(input, report.collections);
    if (!owner.ok) return owner;

    const base = await this.checkBaseRepo(input.baseRepo, input.baseRevision ?? null);
    if (!base.ok) return base;

    const held = await chooseHeldOut(this.reads, input, text, params.value.seed);
    if (!held.ok) return held;

    const gguf = input.gguf ?? model.engine === 'llamacpp';
    await this.reads.keepData(text, report.sha256);
    const createdById = actor.viewer.kind === 'user' || actor.viewer.kind === 'token' ? actor.viewer.user.id : null;
    const job = await this.db
      .$transaction(async (tx) => {
        // The owner was checked above; under the organisation's lock it cannot be deleted before the job names it.
        if (owner.value) {
          await lockOrgTree(tx);
          const still = await this.owners.resolveOwner(owner.value, { db: tx });
          if (!still.ok) throw new OwnerGone(still.error.message);
        }
        const j = await tx.trainJob.create({
          data: {
            name: input.name,
            model: model.name,
            baseRepo: input.baseRepo,
            baseRevision: input.baseRevision ?? null,
            nodeId: node.id,
            owner: owner.value,
            gpuMiB: input.gpuMiB,
            params: params.value,
            gguf,
            dataPath: this.reads.dataFile(report.sha256),
            dataSha256: report.sha256,
            dataBytes: report.bytes,
            pairs: report.pairs,
            ...held.value,
            createdById,
            message: await this.node.waitReason(tx, node, input.gpuMiB),
          },
        });
        await this.ledger.event(
          tx,
          j.id,
          'info',
          `queued for node ${node.name}: ${report.pairs} pairs, data sha256 ${report.sha256}`,
        );
        await this.ledger.event(tx, j.id, 'info', heldOutNote(held.value, report.pairs));
        if (base.value) await this.ledger.event(tx, j.id, 'warn', base.value);
        await this.audit.done(tx, actor, {
          action: 'createTrainJob',
          target: input.name,
          message: `job ${j.id} on ${node.name} for ${model.name} from ${input.baseRepo}, ${report.pairs} pairs`,
          owner: j.owner,
        });
        await this.ledger.changed(tx, j);
        return j;
      })
      .catch((err: unknown) => (err instanceof OwnerGone ? err : Promise.reject(err)));
    if (job instanceof OwnerGone) return fail(new ValidationError('owner', job.message));
    return ok(job);
  }

  /** The owner as "scope:id", or null for public. See docs: pairs from a knowledge base are never public. */
  private async ownerFor(
    input: { owner?: string | null; public?: boolean | null },
    collections: string[],
  ): Promise<Result<string | null>> {
    const found = [];
    for (const id of collections) {
      const c = await this.owners.collection(id);
      if (!c)
        return fail(
          new ValidationError(
            'data',
            `the pairs come from collection ${id}, which is not here: each "collection" is a collection's id`,
          ),
        );
      found.push(c);
    }
    if (input.public) {
      if (found.length)
        return fail(
          new ValidationError(
            'public',
            `these pairs come from a knowledge base (${found.map((c) => c.name).join(', ')}), and an adapter trained on them carries some of what it says: it belongs to an owner who may read it, never to everyone`,
          ),
        );
      if (input.owner) return fail(new ValidationError('owner', 'an adapter is public or has an owner, not both'));
      return ok(null);
    }
    let owner: { scope: OwnerScope; id: string; label: string };
    if (!input.owner) {
      const only = found.length === 1 ? found[0] : undefined;
      if (!only)
        return fail(
          new ValidationError(
            'owner',
            found.length
              ? `the pairs come from ${found.length} collections: name the adapter's owner (org:, team:, project:, user: or key:), one who may read them all`
              : "name the adapter's owner (org:, team:, project:, user: or key:), or make it public",
          ),
        );
      return ok(`${only.ownerScope}:${only.ownerId}`);
    }
    const resolved = await this.owners.resolveOwner(input.owner);
    if (!resolved.ok) return resolved;
    owner = resolved.value;
    for (const c of found) {
      if (!(await this.owners.canRead({ scope: owner.scope, id: owner.id }, c.id)))
        return fail(
          new ValidationError(
            'owner',
            `${owner.label} may not read collection ${c.name}, which the pairs come from: an adapter trained on it would tell its callers what it says`,
          ),
        );
    }
    return ok(`${owner.scope}:${owner.id}`);
  }

  /**
   * Whether the base weights can be found: a mirrored copy, or the registry's listing. A registry that does not
   * answer is not a refusal (the node fetches at claim time); it is returned as a warning for the job's events.
   */
  private async checkBaseRepo(repo: string, revision: string | null): Promise<Result<string | null>> {
    if ((await baseFilesFromMirror(this.db, this.mirror, repo)).length) return ok(null);
    const listed = await baseFilesFromHub(this.registry, repo, revision);
    if (listed.ok) return ok(null);
    if (listed.kind === 'missing') return fail(new ValidationError('baseRepo', `base_repo ${repo}: ${listed.reason}`));
    if (listed.kind === 'not-safetensors') return fail(new ValidationError('baseRepo', listed.reason));
    return ok(
      `the registry could not be asked about ${repo} (${listed.reason}); the node will fetch it when it starts`,
    );
  }

  // ─── the operator's controls ───────────────────────────────────────────────

  async cancel(actor: Actor, id: string): Promise<Result<TrainJob>> {
    const job = await this.reads.visible(actor, id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (ended(job.state))
      return fail(new ConflictError(`the job has already ended (${job.state.toLowerCase()}): nothing to cancel`));
    const out = await this.db.$transaction(async (tx) => {
      if (job.state === 'QUEUED') {
        const n = await tx.trainJob.updateMany({
          where: { id, state: 'QUEUED' },
          data: { state: 'CANCELLED', finishedAt: new Date(), message: 'cancelled before it started' },
        });
        if (n.count === 1) {
          await this.ledger.event(tx, id, 'info', `cancelled by ${describeActor(actor)} before it started`);
          await this.audit.done(tx, actor, {
            action: 'cancelTrainJob',
            target: job.name,
            message: `job ${id}, queued`,
            owner: job.owner,
          });
          const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
          await this.ledger.changed(tx, j);
          return j;
        }
      }
      // Running (or claimed just now): the agent stops the trainer, waits for it to exit, then reports CANCELLED.
      const n = await tx.trainJob.updateMany({
        where: { id, state: 'RUNNING' },
        data: { cancelRequestedAt: new Date(), message: 'cancelling: the node is stopping the trainer' },
      });
      if (n.count === 0) return null;
      await this.ledger.event(
        tx,
        id,
        'info',
        `cancel asked by ${describeActor(actor)}: waiting for the node to stop the trainer`,
      );
      await this.audit.done(tx, actor, {
        action: 'cancelTrainJob',
        target: job.name,
        message: `job ${id}, running`,
        owner: job.owner,
      });
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      await this.ledger.changed(tx, j);
      return j;
    });
    if (!out) return fail(new ConflictError('the job ended while it was being cancelled'));
    return ok(out);
  }

  async remove(actor: Actor, id: string): Promise<Result<{ id: string; name: string }>> {
    const job = await this.reads.visible(actor, id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (!ended(job.state))
      return fail(new ConflictError(`the job is ${job.state.toLowerCase()}: cancel it first, then delete it`));
    // Read before the rows go (they go with the job): on a bucket, their blobs are removed after it.
    const arts = await this.db.trainArtifact.findMany({ where: { jobId: id }, select: { sha256: true, path: true } });
    await this.db.$transaction(async (tx) => {
      const n = await tx.trainJob.deleteMany({ where: { id, state: { in: [...ENDED] } } });
      if (n.count !== 1) throw new ConflictError('the job changed while it was being deleted');
      await this.evaluations.forget(tx, id);
      await this.audit.done(tx, actor, {
        action: 'deleteTrainJob',
        target: job.name,
        message: `job ${id}`,
        owner: job.owner,
      });
      await notify(tx, 'trainJob', id);
    });
    // Files after the rows: a crash in between leaves files no row points at, never a row without its files.
    await fs.rm(this.reads.jobDir(id), { recursive: true, force: true });
    await this.reads.files.forgetArtifacts(arts);
    const stillUsed = await this.db.trainJob.count({ where: { dataSha256: job.dataSha256 } });
    if (!stillUsed) await this.reads.files.forgetData(job.dataSha256, job.dataPath);
    return ok({ id, name: job.name });
  }
}

/** The data report's line on the held-out pairs, so the operator sees what the adapter is not trained on. */
function heldOutNote(h: { heldOutLines: number[]; evalDataSha256: string | null; evalSeed: number }, pairs: number) {
  if (h.evalDataSha256)
    return `evaluated on the evaluation file (sha256 ${h.evalDataSha256}); all ${pairs} pairs are trained on`;
  if (!h.heldOutLines.length) return 'no pairs held out: the adapter will not be evaluated against its base';
  return `${h.heldOutLines.length} of ${pairs} pairs held out to evaluate the adapter (never trained on; picked by seed ${h.evalSeed}); ${pairs - h.heldOutLines.length} trained on`;
}

/** The owner was deleted between the check and the insert (the insert waits on the organisation's lock). */
class OwnerGone extends Error {}
