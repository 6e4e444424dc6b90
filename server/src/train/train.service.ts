import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { withState } from '../audit/message.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { asLoop, type Db, type Tx } from '../db/client.js';
import { isDatabaseUnreachable, LoopHealth } from '../db/outage.js';
import type { FleetService } from '../fleet/fleet.service.js';
import type { Node, TrainJob } from '../generated/prisma/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { parseInput } from '../lib/validate.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { lockOrgTree } from '../org/org.service.js';
import { notify } from '../pubsub.js';
import type { RegistryService } from '../registry/registry.service.js';
import { type BaseFile, baseFilesFromHub, baseFilesFromMirror } from './base-files.js';
import {
  checkTrainData,
  type LengthStats,
  pairsOf,
  stats,
  TRAIN_MAX_DATA_BYTES,
  type TrainDataLine,
  type TrainDataReport,
} from './data.js';
import { catalogGguf } from './model-file.js';
import type { OwnerRules } from './owner.js';
import { parseParams, TRAIN_PARAMS, type TrainParams } from './params.js';
import { Tokenizers } from './tokens.js';

// Training jobs: the rules of DESIGN.md §5 "Train" and docs/training.md. Every state change is one transaction
// that also records an event and queues the NOTIFY, so the console, scripts and the node's agent all read the
// same truth, and a server restart loses nothing: the job's state is the database's.

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;
const REPO = /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/;
const uuid = z.string().uuid();

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
});

export type TrainSpec = {
  id: string;
  name: string;
  base_repo: string;
  base_revision: string | null;
  params: TrainParams;
  data: { url: string; sha256: string; bytes: number; pairs: number };
  base: { files: BaseFile[] };
  gguf: boolean;
};

export type TrainWorkItem = {
  id: string;
  name: string;
  state: 'QUEUED' | 'RUNNING';
  gpuMiB: number;
  cancelRequested: boolean;
};

const ENDED = ['DONE', 'FAILED', 'CANCELLED'] as const;
const ended = (s: string) => (ENDED as readonly string[]).includes(s);

type Caller = Pick<Context, 'viewer' | 'requestId'>;

export class TrainService {
  readonly dataDir: string;
  readonly jobsDir: string;
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> = Promise.resolve();
  /**
   * Since when this control plane has been able to hear its nodes: it started, or its database came back. The
   * lost clock counts from here at the earliest.
   */
  private hearingSince = Date.now();
  /** The last sweep found the database out of reach. */
  private deaf = false;
  /** The sweeps' view of the database: paused while it is out of reach (nothing is failed meanwhile). */
  private sweepHealth: LoopHealth | undefined;
  get health(): LoopHealth {
    this.sweepHealth ??= new LoopHealth('training sweeps', this.log);
    return this.sweepHealth;
  }
  private baseUrl: () => string = () => 'http://127.0.0.1';
  private readonly tokenizers: Tokenizers;

  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
    private readonly config: Config,
    private readonly fleet: FleetService,
    private readonly mirror: MirrorService,
    private readonly registry: RegistryService,
    private readonly owners: OwnerRules,
    private readonly log: Logger,
  ) {
    this.dataDir = path.join(config.dataDir, 'train', 'data');
    this.jobsDir = path.join(config.dataDir, 'train', 'jobs');
    this.tokenizers = new Tokenizers(log);
  }

  setBaseUrl(get: () => string) {
    this.baseUrl = get;
  }
  private base() {
    return this.config.publicUrl ?? this.baseUrl();
  }
  dataUrl(id: string) {
    return `${this.base()}/api/train/jobs/${id}/data`;
  }
  dataFile(sha256: string) {
    return path.join(this.dataDir, `${sha256}.ndjson`);
  }
  jobDir(id: string) {
    return path.join(this.jobsDir, id);
  }

  // ─── reading ───────────────────────────────────────────────────────────────

  get(id: string) {
    return uuid.safeParse(id).success ? this.db.trainJob.findUnique({ where: { id } }) : Promise.resolve(null);
  }

  /**
   * Who may read a job's pairs: the node it is for (it trains on them), and operators whom the job's owner admits
   * (admins always). Pairs from a team's knowledge base say what the base says, so an operator outside the team
   * may not read them, nor may another node.
   */
  async mayReadData(viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>): Promise<boolean> {
    if (viewer.kind === 'node') return job.nodeId !== null && viewer.node.id === job.nodeId;
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return false;
    return roleAtLeast(viewer.role, 'OPERATOR') && this.owners.mayRead(viewer, job.owner);
  }

  /**
   * Who may download what a job made. A public job's: any signed-in caller or node, as before. An owned job's:
   * those its owner admits (admins always) and the job's own node; an adapter repeats what it was trained on.
   */
  async mayReadArtifacts(viewer: Viewer, job: Pick<TrainJob, 'nodeId' | 'owner'>): Promise<boolean> {
    if (viewer.kind === 'node') return job.owner === null || (job.nodeId !== null && viewer.node.id === job.nodeId);
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return false;
    return this.owners.mayRead(viewer, job.owner);
  }

  async page(input: { state?: string | null; first?: number | null; after?: string | null }) {
    const first = Math.min(Math.max(input.first ?? 50, 1), 200);
    const after = input.after ? await this.get(input.after) : null;
    const state =
      input.state && ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'].includes(input.state)
        ? input.state
        : undefined;
    const rows = await this.db.trainJob.findMany({
      where: {
        ...(state ? { state: state as TrainJob['state'] } : {}),
        ...(after
          ? { OR: [{ createdAt: { lt: after.createdAt } }, { createdAt: after.createdAt, id: { lt: after.id } }] }
          : {}),
      },
      orderBy: [{ createdAt: 'desc' }, { id: 'desc' }],
      take: first + 1,
    });
    return { rows: rows.slice(0, first), hasNextPage: rows.length > first };
  }

  // ─── the pairs ─────────────────────────────────────────────────────────────

  /**
   * The pairs as createTrainJob will read them; with `model`, also their lengths in that model's tokens (and
   * how many pass `maxLen`, 1024 by default as the trainer's).
   */
  async check(data: string, o: { model?: string | null; maxLen?: number | null } = {}): Promise<TrainDataReport> {
    const report = checkTrainData(data);
    if (!o.model || report.pairs === 0) return report;
    const local = await catalogGguf(this.db, this.mirror, o.model);
    if (!local.ok) return { ...report, tokensNote: `no token counts: ${local.reason}` };
    const pairs = [...pairsOf(data)].filter((p): p is TrainDataLine => !('error' in p));
    try {
      const q = await this.tokenizers.count(
        local.file,
        pairs.map((p) => p.q),
      );
      const a = await this.tokenizers.count(
        local.file,
        pairs.map((p) => p.a),
      );
      const both = q.map((n, i) => n + (a[i] ?? 0));
      const r = TRAIN_PARAMS.max_len;
      const maxLen = o.maxLen && o.maxLen >= r.min && o.maxLen <= r.max ? o.maxLen : r.default;
      return {
        ...report,
        tokens: {
          model: o.model,
          question: stats(q) as LengthStats,
          answer: stats(a) as LengthStats,
          pair: stats(both) as LengthStats,
          maxLen,
          overMaxLen: both.filter((n) => n > maxLen).length,
        },
        tokensNote: null,
      };
    } catch (err) {
      return { ...report, tokensNote: `no token counts: the tokenizer could not be read (${(err as Error).message})` };
    }
  }

  /**
   * Keeps uploaded pairs by their sha256 (the same data uploaded twice is kept once) and returns the report.
   * Kept even when the report has errors: the console shows them, and createTrainJob refuses the sha256 then.
   */
  async storeData(data: string, o: { model?: string | null; maxLen?: number | null } = {}): Promise<TrainDataReport> {
    const report = await this.check(data, o);
    if (report.bytes <= TRAIN_MAX_DATA_BYTES) await this.keepData(data, report.sha256);
    return report;
  }

  /**
   * Writes the pairs under their sha256, once: whole or not at all (a rename), so a crash leaves no half file.
   * Each upload writes a temporary file of its own: the same pairs sent eight times at once (a console tab and a
   * script, a retry) are eight renames of the same bytes onto one name, each answered with the same sha256.
   */
  private async keepData(data: string, sha256: string) {
    const file = this.dataFile(sha256);
    await fs.mkdir(this.dataDir, { recursive: true });
    const exists = await fs.stat(file).then(
      () => true,
      () => false,
    );
    if (exists) return;
    const part = `${file}.${randomUUID()}.part`;
    try {
      await fs.writeFile(part, data);
      await fs.rename(part, file);
    } finally {
      await fs.rm(part, { force: true });
    }
  }

  // ─── submitting ────────────────────────────────────────────────────────────

  async create(ctx: Context, raw: unknown): Promise<Result<TrainJob>> {
    const parsed = parseInput(createInput, raw, '');
    if (!parsed.ok) return parsed;
    const input = parsed.value;
    const refuse = (field: string, message: string) => fail(new ValidationError(field, message));

    if (!NAME.test(input.name))
      return refuse(
        'name',
        `an adapter's name is letters, digits, ".", "_" and "-", up to 100, starting with a letter or digit: ${JSON.stringify(input.name)} is not`,
      );
    const model = await this.db.catalogModel.findUnique({ where: { name: input.model } });
    if (!model)
      return refuse(
        'model',
        `no model ${input.model} in the catalog: an adapter is trained for a model the fleet serves`,
      );
    const clash =
      (await this.db.catalogModel.findUnique({ where: { name: input.name }, select: { id: true } })) ??
      (await this.db.adapter.findUnique({ where: { name: input.name }, select: { id: true } }));
    if (clash)
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
    const node = await this.db.node.findUnique({ where: { name: input.node } });
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
      for (const o of ownedBy) if (!(await this.owners.mayRead(ctx.viewer, o.owner))) mayUse = false;
      const stored = mayUse
        ? await fs.readFile(this.dataFile(input.dataSha256 as string), 'utf8').catch(() => null)
        : null;
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

    const gguf = input.gguf ?? model.engine === 'llamacpp';
    await this.keepData(text, report.sha256);
    const createdById = ctx.viewer.kind === 'user' || ctx.viewer.kind === 'token' ? ctx.viewer.user.id : null;
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
            dataPath: this.dataFile(report.sha256),
            dataSha256: report.sha256,
            dataBytes: report.bytes,
            pairs: report.pairs,
            createdById,
            message: await this.waitReason(tx, node, input.gpuMiB),
          },
        });
        await this.event(
          tx,
          j.id,
          'info',
          `queued for node ${node.name}: ${report.pairs} pairs, data sha256 ${report.sha256}`,
        );
        if (base.value) await this.event(tx, j.id, 'warn', base.value);
        await this.audit.done(tx, ctx, {
          action: 'createTrainJob',
          target: input.name,
          message: `job ${j.id} on ${node.name} for ${model.name} from ${input.baseRepo}, ${report.pairs} pairs`,
        });
        await this.changed(tx, j);
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

  async cancel(ctx: Context, id: string): Promise<Result<TrainJob>> {
    const job = await this.get(id);
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
          await this.event(tx, id, 'info', `cancelled by ${who(ctx)} before it started`);
          await this.audit.done(tx, ctx, { action: 'cancelTrainJob', target: job.name, message: `job ${id}, queued` });
          const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
          await this.changed(tx, j);
          return j;
        }
      }
      // Running (or claimed just now): the agent stops the trainer, waits for it to exit, then reports CANCELLED.
      const n = await tx.trainJob.updateMany({
        where: { id, state: 'RUNNING' },
        data: { cancelRequestedAt: new Date(), message: 'cancelling: the node is stopping the trainer' },
      });
      if (n.count === 0) return null;
      await this.event(tx, id, 'info', `cancel asked by ${who(ctx)}: waiting for the node to stop the trainer`);
      await this.audit.done(tx, ctx, { action: 'cancelTrainJob', target: job.name, message: `job ${id}, running` });
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      await this.changed(tx, j);
      return j;
    });
    if (!out) return fail(new ConflictError('the job ended while it was being cancelled'));
    return ok(out);
  }

  async remove(ctx: Context, id: string): Promise<Result<{ id: string; name: string }>> {
    const job = await this.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (!ended(job.state))
      return fail(new ConflictError(`the job is ${job.state.toLowerCase()}: cancel it first, then delete it`));
    await this.db.$transaction(async (tx) => {
      const n = await tx.trainJob.deleteMany({ where: { id, state: { in: [...ENDED] } } });
      if (n.count !== 1) throw new ConflictError('the job changed while it was being deleted');
      await this.audit.done(tx, ctx, { action: 'deleteTrainJob', target: job.name, message: `job ${id}` });
      await notify(tx, 'trainJob', id);
    });
    // Files after the rows: a crash in between leaves files no row points at, never a row without its files.
    await fs.rm(this.jobDir(id), { recursive: true, force: true });
    const stillUsed = await this.db.trainJob.count({ where: { dataSha256: job.dataSha256 } });
    if (!stillUsed) await fs.rm(job.dataPath, { force: true });
    return ok({ id, name: job.name });
  }

  // ─── the node's side ───────────────────────────────────────────────────────

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
  async claim(ctx: Caller, id: string): Promise<Result<{ job: TrainJob; spec: TrainSpec }>> {
    if (ctx.viewer.kind !== 'node') return fail(new ConflictError('only a node agent claims a job'));
    const node = ctx.viewer.node;
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

    const now = new Date();
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
  private async leased(ctx: Caller, id: string): Promise<Result<TrainJob>> {
    if (ctx.viewer.kind !== 'node') return fail(new ConflictError('only the node running a job reports on it'));
    const job = await this.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.state !== 'RUNNING')
      return fail(new ConflictError(`the job is ${job.state.toLowerCase()}: a report for it changes nothing`));
    if (job.leaseOwner !== ctx.viewer.node.id) return fail(new ConflictError('another node runs this job'));
    return ok(job);
  }

  async report(ctx: Caller, id: string, raw: unknown): Promise<Result<TrainJob>> {
    const parsed = parseInput(progressInput, raw, 'input');
    if (!parsed.ok) return parsed;
    const held = await this.leased(ctx, id);
    if (!held.ok) return held;
    const { steps, message } = parsed.value;
    const points = parsed.value.points ?? [];
    const events = parsed.value.events ?? [];
    const last = points.at(-1);
    const peak = points.reduce<number | null>((m, p) => (p.peakMiB != null ? Math.max(m ?? 0, p.peakMiB) : m), null);
    const updated = await this.db.$transaction(async (tx) => {
      // Conditional on the lease, so a report racing a cancel, a finish or an expiry changes nothing.
      const n = await tx.trainJob.updateMany({
        where: { id, state: 'RUNNING', leaseOwner: held.value.leaseOwner },
        data: {
          leaseUntil: this.leaseFrom(new Date()),
          ...(steps != null ? { steps } : {}),
          ...(last && last.step >= held.value.step ? { step: last.step, loss: last.loss } : {}),
          ...(peak != null && peak > (held.value.peakMiB ?? 0) ? { peakMiB: peak } : {}),
          ...(message && !held.value.cancelRequestedAt ? { message } : {}),
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

  async finish(ctx: Caller, id: string, state: string, message: string | null | undefined): Promise<Result<TrainJob>> {
    if (!['DONE', 'FAILED', 'CANCELLED'].includes(state))
      return fail(new ValidationError('state', 'a job finishes DONE, FAILED or CANCELLED'));
    const held = await this.leased(ctx, id);
    if (!held.ok) return held;
    const job = held.value;
    if (state === 'DONE') {
      const peft = await this.db.trainArtifact.findUnique({ where: { jobId_kind: { jobId: id, kind: 'peft' } } });
      if (!peft) return fail(new ConflictError('upload the adapter (PUT …/artifacts/peft) before finishing DONE'));
    }
    const text =
      message?.slice(0, 2000) ??
      (state === 'DONE' ? 'trained' : state === 'CANCELLED' ? 'cancelled; the trainer has exited' : 'failed');
    return this.end(id, state as 'DONE' | 'FAILED' | 'CANCELLED', text, { leaseOwner: job.leaseOwner }, ctx);
  }

  /** Ends a running job, once: the conditional update makes a second end (a duplicate, an expiry) a no-op. */
  private async end(
    id: string,
    state: 'DONE' | 'FAILED' | 'CANCELLED',
    message: string,
    where: { leaseOwner?: string | null; leaseUntilBefore?: Date },
    ctx?: Caller,
  ): Promise<Result<TrainJob>> {
    const out = await this.db.$transaction(async (tx) => {
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
      if (ctx)
        await this.audit.done(tx, ctx, { action: 'finishTrainJob', target: j.name, message: `${state}: ${message}` });
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
    this.hearingSince = Date.now();
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

  /** One sweep at a time; a call made during one runs after it (its `now` may be later than the timer's). */
  sweep(now = new Date()): Promise<void> {
    // On the loops' connections, also when a request asks for one (the callback runs where .then was called).
    this.sweeping = asLoop(() => this.sweeping.then(() => this.sweepOnce(now)));
    return this.sweeping;
  }

  private async sweepOnce(now: Date) {
    try {
      const expired = await this.db.trainJob.findMany({
        where: { state: 'RUNNING', leaseUntil: { lt: now } },
        include: { node: true },
      });
      if (this.deaf) {
        this.deaf = false;
        this.hearingSince = Date.now();
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
          );
        else
          await this.end(
            j.id,
            'FAILED',
            `${node} stopped reporting for ${secs} s (offline, or its agent stopped): the run is lost; submit it again`,
            { leaseUntilBefore: now },
          );
      }
      const queued = await this.db.trainJob.findMany({ where: { state: 'QUEUED' }, include: { node: true } });
      for (const j of queued) {
        const reason = j.node
          ? await this.waitReason(this.db, j.node, j.gpuMiB, j.id)
          : 'its node was removed: delete the job, or submit it for another node';
        if (reason !== j.message) {
          await this.db.$transaction(async (tx) => {
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
  private async waitReason(db: Db | Tx, node: Node, gpuMiB: number, self?: string): Promise<string> {
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

  // ─── helpers ───────────────────────────────────────────────────────────────

  private leaseFrom(now: Date) {
    return new Date(now.getTime() + this.config.trainLostSeconds * 1000);
  }

  async event(tx: Db | Tx, jobId: string, level: 'info' | 'warn' | 'error', message: string) {
    await tx.trainEvent.create({ data: { jobId, level, message: message.slice(0, 4000) } });
  }

  /** Queues the NOTIFYs for a job's change: its watchers, and its node's agent. */
  async changed(tx: Db | Tx, job: Pick<TrainJob, 'id' | 'nodeId'>) {
    await notify(tx, 'trainJob', job.id);
    if (job.nodeId) await notify(tx, 'trainWork', job.nodeId);
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

/** The owner was deleted between the check and the insert (the insert waits on the organisation's lock). */
class OwnerGone extends Error {}

/** The most free memory on one of the node's GPUs: a job needs its memory on one card (placement sums them). */
function freeMiB(node: Node): number {
  const gpus = Array.isArray(node.gpus) ? (node.gpus as { freeMiB?: number }[]) : [];
  return gpus.reduce((m, g) => Math.max(m, Number(g.freeMiB ?? 0)), 0);
}

/** The node's card with the most memory in all (free or not), as its agent last reported; null before any. */
function largestCard(node: Node): { index: number; name: string; totalMiB: number } | null {
  const gpus = Array.isArray(node.gpus) ? (node.gpus as { index?: number; name?: string; totalMiB?: number }[]) : [];
  let best: { index: number; name: string; totalMiB: number } | null = null;
  gpus.forEach((g, i) => {
    const totalMiB = Number(g.totalMiB ?? 0);
    if (!best || totalMiB > best.totalMiB) best = { index: g.index ?? i, name: g.name ?? 'GPU', totalMiB };
  });
  return best;
}

function who(ctx: Caller) {
  const v = ctx.viewer;
  return v.kind === 'user' || v.kind === 'token' ? v.user.email : v.kind === 'node' ? `node ${v.node.name}` : v.kind;
}
