import type { TrainJob } from '../generated/prisma/client.js';
import { ConflictError, NotFoundError, UpstreamError, unwrap, ValidationError } from '../lib/errors.js';
import { seenOwners } from '../org/org.service.js';
import { sees, sightOf } from '../org/visible.js';
import type { PubSub } from '../pubsub.js';
import { builder } from '../schema/builder.js';
import { JobStateEnum } from '../serve/serve-job.schema.js';
import type { PublishAnswer } from './artifacts.js';
import { TRAIN_PARAMS } from './params.js';
import type { TrainWorkItem } from './train.service.js';
import { TrainDataReportRef, TrainJobConnection, TrainJobRef, TrainParamRef } from './train.types.js';

// Types live in train.types.ts; re-exported so importers keep importing them from here.
export { TrainDataReportRef, TrainJobRef } from './train.types.js';

// The evaluation's types and fields (on TrainJob, TrainMetric, Adapter) and the node's report of it.
import './eval.schema.js';

// LoRA training jobs (docs/training.md): what operators and scripts see and do, and the node agent's side
// (claim, report, finish, its work list) behind the node token.

builder.queryFields((t) => ({
  trainJobs: t.field({
    type: TrainJobConnection,
    description: 'Newest first. `after` is the endCursor of the previous page.',
    authScopes: { viewer: true },
    args: {
      state: t.arg({ type: JobStateEnum, required: false }),
      first: t.arg.int({ required: false, defaultValue: 50, description: '1 to 200.' }),
      after: t.arg.string({ required: false }),
    },
    // Only the jobs the caller may see: an owned job's name is its adapter's, and its owner the team's.
    resolve: async (_root, args, ctx, info) => ctx.services.train.page(args, seenOwners(await sightOf(ctx, info))),
  }),
  trainJob: t.prismaField({
    type: 'TrainJob',
    nullable: true,
    description: 'Null for a job the caller may not see (owned by an owner that does not admit it), as for none.',
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (query, _root, args, ctx, info) => {
      const job = await ctx.services.train.get(String(args.id));
      if (!job || !sees(await sightOf(ctx, info), job.owner)) return null;
      return ctx.prisma.trainJob.findUnique({ ...query, where: { id: job.id } });
    },
  }),
  checkTrainData: t.field({
    type: TrainDataReportRef,
    description:
      'Checks pairs (NDJSON of {"q","a"}) as createTrainJob will; with `model`, counts tokens too. Over 1 MiB: POST /api/train/data.',
    authScopes: { viewer: true },
    args: {
      data: t.arg.string({ required: true }),
      model: t.arg.string({ required: false, description: 'A catalog model: count tokens with its tokenizer.' }),
      maxLen: t.arg.int({ required: false, description: 'The max_len to compare with (default 1024).' }),
    },
    resolve: (_root, args, ctx) =>
      ctx.services.train.check(args.data, { model: args.model, maxLen: args.maxLen, viewer: ctx.viewer }),
  }),
  trainParams: t.field({
    type: [TrainParamRef],
    authScopes: { viewer: true },
    resolve: () => Object.entries(TRAIN_PARAMS).map(([name, r]) => ({ name, ...r })),
  }),
}));

const CreateTrainJobInput = builder.inputType('CreateTrainJobInput', {
  fields: (t) => ({
    name: t.string({ required: true, description: "The adapter's name: letters, digits, . _ -, up to 100." }),
    model: t.string({ required: true, description: 'The catalog model it is for.' }),
    baseRepo: t.string({ required: true, description: 'The base weights on the registry: owner/name, safetensors.' }),
    baseRevision: t.string({ required: false }),
    node: t.string({ required: true, description: 'The node that trains it, by name.' }),
    gpuMiB: t.int({ required: true, description: 'The GPU memory it needs of one card, in MiB.' }),
    owner: t.string({ required: false, description: 'org:, team:, project: (path or id), user: or key:.' }),
    public: t.boolean({ required: false, description: 'Every caller of the model may use it (not with an owner).' }),
    data: t.string({ required: false, description: 'The pairs inline: NDJSON of {"q","a"} (optional "collection").' }),
    dataSha256: t.string({ required: false, description: 'Or the sha256 POST /api/train/data answered with.' }),
    params: t.field({
      type: 'JSON',
      required: false,
      description: 'rank, alpha, dropout, epochs, lr, batch, max_len, seed.',
    }),
    gguf: t.boolean({
      required: false,
      description: 'Make the llama.cpp GGUF adapter (default: when llama.cpp serves the model).',
    }),
    evalShare: t.float({
      required: false,
      description:
        'The share of pairs held out to evaluate the adapter against its base, never trained on: 0 to 0.5 (default 0.1; at least 5 questions, at most 200).',
    }),
    evalSeed: t.int({
      required: false,
      description: 'The seed that picks them (default the training seed); recorded.',
    }),
    evalData: t.string({
      required: false,
      description: 'Or an evaluation file: NDJSON of {"q","a"}, at most 200; then every pair is trained on.',
    }),
  }),
});

const PublishedRef = builder.objectRef<PublishAnswer>('TrainJobPublished').implement({
  fields: (t) => ({
    adapter: t.exposeString('adapter'),
    model: t.exposeString('model'),
    source: t.exposeString('source', { description: 'Where the nodes fetch it: the mirror.' }),
    owner: t.exposeString('owner', { nullable: true }),
    note: t.exposeString('note', { description: 'What to do for replicas to load it.' }),
    liveWithoutRestart: t.exposeBoolean('liveWithoutRestart', {
      description:
        "True when the model's replicas load it as they run (each agent fetches it at its next poll): call it by its name; nothing to restart.",
    }),
  }),
});

const DeletedTrainJob = builder.objectRef<{ id: string; name: string }>('DeletedTrainJob').implement({
  fields: (t) => ({ id: t.exposeID('id'), name: t.exposeString('name') }),
});

const TrainClaimRef = builder.objectRef<{ job: TrainJob; spec: unknown }>('TrainClaim').implement({
  fields: (t) => ({
    job: t.field({ type: TrainJobRef, resolve: (c) => c.job }),
    spec: t.field({
      type: 'JSON',
      description: 'job.json for the trainer, less the local paths.',
      resolve: (c) => c.spec,
    }),
  }),
});

const TrainPointInput = builder.inputType('TrainPointInput', {
  fields: (t) => ({
    step: t.int({ required: true }),
    loss: t.float({ required: true }),
    lr: t.float({ required: false }),
    peakMiB: t.int({ required: false }),
    tokensPerSecond: t.float({ required: false }),
    evalLoss: t.float({ required: false, description: 'The loss on the held-out pairs, at an evaluation step.' }),
  }),
});
const TrainEventInput = builder.inputType('TrainEventInput', {
  fields: (t) => ({
    level: t.string({ required: true, description: 'info, warn or error.' }),
    message: t.string({ required: true }),
  }),
});
const TrainProgressInput = builder.inputType('TrainProgressInput', {
  fields: (t) => ({
    steps: t.int({ required: false }),
    points: t.field({ type: [TrainPointInput], required: false }),
    events: t.field({ type: [TrainEventInput], required: false }),
    message: t.string({ required: false }),
  }),
});

builder.mutationFields((t) => ({
  createTrainJob: t.field({
    type: TrainJobRef,
    description: 'Queues a LoRA training job on a node. Watch it with trainJobChanged.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { input: t.arg({ type: CreateTrainJobInput, required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.train.create(ctx.actor, args.input)),
  }),
  cancelTrainJob: t.field({
    type: TrainJobRef,
    description: 'A queued job ends at once; a running one once its node has stopped the trainer.',
    authScopes: { operator: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.train.cancel(ctx.actor, String(args.id))),
  }),
  deleteTrainJob: t.field({
    type: DeletedTrainJob,
    description: 'Deletes an ended job, its metrics and its files (a published adapter stays).',
    authScopes: { operator: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.train.remove(ctx.actor, String(args.id))),
  }),
  publishTrainJob: t.field({
    type: PublishedRef,
    description:
      "Puts a DONE job's adapter in the mirror and the catalog, owned as the job says. Refused when its evaluation is WORSE than its base (on its pairs, or on the general questions), unless `force` with a `reason` (audited).",
    authScopes: { operator: true },
    errors: { types: [NotFoundError, ConflictError, UpstreamError, ValidationError] },
    args: {
      id: t.arg.id({ required: true }),
      force: t.arg.boolean({ required: false, description: 'Publish past a WORSE evaluation; needs a reason.' }),
      reason: t.arg.string({ required: false, description: 'Why, kept in the audit log with the evaluation.' }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.trainArtifacts.publish(ctx.actor, String(args.id), {
          force: args.force,
          reason: args.reason,
        }),
      ),
  }),
  claimTrainJob: t.field({
    type: TrainClaimRef,
    description: 'A node agent takes a queued job (node token only). One runner, ever.',
    authScopes: { node: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.train.claim(ctx.actor, String(args.id))),
  }),
  reportTrainProgress: t.field({
    type: TrainJobRef,
    description: 'A node agent reports steps, events and what it is doing; renews its lease (node token only).',
    authScopes: { node: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: TrainProgressInput, required: true }) },
    resolve: async (_root, args, ctx) =>
      unwrap(await ctx.services.train.report(ctx.actor, String(args.id), args.input)),
  }),
  finishTrainJob: t.field({
    type: TrainJobRef,
    description: 'A node agent ends its job: DONE (after the upload), FAILED or CANCELLED (node token only).',
    authScopes: { node: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      id: t.arg.id({ required: true }),
      state: t.arg({ type: JobStateEnum, required: true }),
      message: t.arg.string({ required: false }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(await ctx.services.train.finish(ctx.actor, String(args.id), args.state, args.message)),
  }),
}));

const TrainAssignmentRef = builder.objectRef<TrainWorkItem>('TrainAssignment').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    state: t.field({ type: JobStateEnum, resolve: (w) => w.state }),
    gpuMiB: t.exposeInt('gpuMiB'),
    cancelRequested: t.exposeBoolean('cancelRequested'),
  }),
});
const NodeTrainWorkRef = builder.objectRef<{ jobs: TrainWorkItem[] }>('NodeTrainWork').implement({
  fields: (t) => ({ jobs: t.field({ type: [TrainAssignmentRef], resolve: (w) => w.jobs }) }),
});

builder.subscriptionFields((t) => ({
  trainJobChanged: t.field({
    type: TrainJobRef,
    description: 'One job (with `id`) or every job, whole, each time it changes. A deleted job is not sent.',
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: false }) },
    subscribe: (_root, args, ctx) => changedJobs(ctx, args.id ? String(args.id) : null),
    resolve: (job: TrainJob) => job,
  }),
  nodeTrainWork: t.field({
    type: NodeTrainWorkRef,
    description: "The calling node's training work: sent when subscribed, then whenever it changes (node token).",
    authScopes: { node: true },
    subscribe: (_root, _args, ctx) => workOf(ctx),
    resolve: (w: { jobs: TrainWorkItem[] }) => w,
  }),
}));

/** The node's work list now, then again after every event for this node, sent only when it differs. */
async function* workOf(ctx: {
  viewer: { kind: string; node?: { id: string } };
  pubsub: { subscribe: (topic: 'trainWork') => AsyncIterable<string> };
  services: { train: { work: (nodeId: string) => Promise<TrainWorkItem[]> } };
}) {
  const nodeId = ctx.viewer.kind === 'node' ? ctx.viewer.node?.id : undefined;
  if (!nodeId) return;
  const events = ctx.pubsub.subscribe('trainWork');
  let last = '';
  const next = async () => {
    const jobs = await ctx.services.train.work(nodeId);
    const key = JSON.stringify(jobs);
    if (key === last) return null;
    last = key;
    return { jobs };
  };
  const first = await next();
  if (first) yield first;
  for await (const id of events) {
    if (id !== nodeId) continue;
    const w = await next();
    if (w) yield w;
  }
}

/**
 * Each changed job, read once it has committed; one deleted since the event is skipped, and so is one the
 * subscriber may not see (its sight asked at each event: a membership removed hides the job from then on).
 */
async function* changedJobs(
  ctx: Parameters<typeof sightOf>[0] & {
    pubsub: Pick<PubSub, 'subscribe' | 'shared'>;
    prisma: { trainJob: { findUnique: (a: { where: { id: string } }) => Promise<TrainJob | null> } };
  },
  only: string | null,
) {
  for await (const id of ctx.pubsub.subscribe('trainJob')) {
    if (only && id !== only) continue;
    // One read for every subscriber of this event (pubsub.ts: shared), and so one object their fields share.
    const job = await ctx.pubsub.shared('trainJob', id, 'row', () => ctx.prisma.trainJob.findUnique({ where: { id } }));
    if (job && sees(await sightOf(ctx), job.owner)) yield job;
  }
}
