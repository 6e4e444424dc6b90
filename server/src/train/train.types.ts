import { userById } from '../access/access-store.js';
import { PageInfo } from '../audit/audit.schema.js';
import { adapterOfJob } from '../catalog/catalog-store.js';
import type { TrainArtifact, TrainJob } from '../generated/prisma/client.js';
import { ownerName } from '../org/org.schema.js';
import { sharedField } from '../pubsub.js';
import { builder } from '../schema/builder.js';
import { JobStateEnum } from '../serve/serve-job.schema.js';
import type { TrainDataReport } from './data.js';

// The training domain's GraphQL types (jobs, metrics, artifacts, the data report, the settings); train.schema.ts
// holds the query, mutation and subscription fields and imports this file first, so the types register before them.

const TrainMetricRef = builder.prismaObject('TrainMetric', {
  fields: (t) => ({
    step: t.exposeInt('step'),
    loss: t.exposeFloat('loss'),
    lr: t.exposeFloat('lr', { nullable: true }),
    peakMiB: t.exposeInt('peakMiB', { nullable: true }),
    tokensPerSecond: t.exposeFloat('tokensPerS', { nullable: true }),
    at: t.expose('at', { type: 'DateTime' }),
  }),
});

builder.prismaObject('TrainEvent', {
  fields: (t) => ({
    id: t.exposeID('id'),
    level: t.exposeString('level', { description: 'info, warn or error.' }),
    message: t.exposeString('message'),
    at: t.expose('at', { type: 'DateTime' }),
  }),
});

const ArtifactFile = builder.objectRef<{ name: string; size: number; sha256: string }>('TrainArtifactFile').implement({
  fields: (t) => ({
    name: t.exposeString('name'),
    size: t.field({ type: 'Bytes', resolve: (f) => f.size }),
    sha256: t.exposeString('sha256'),
  }),
});

builder.prismaObject('TrainArtifact', {
  description: 'What a job made: peft (a gzipped tar of the adapter directory) or gguf (the llama.cpp adapter).',
  fields: (t) => ({
    kind: t.string({ resolve: (a) => a.kind }),
    size: t.field({ type: 'Bytes', resolve: (a) => a.size }),
    sha256: t.exposeString('sha256'),
    filename: t.string({
      resolve: async (a, _args, ctx) => {
        const job = await ctx.services.train.get(a.jobId);
        return a.kind === 'gguf' ? `${job?.name}.gguf` : `${job?.name}-peft.tar.gz`;
      },
    }),
    url: t.string({
      description: 'Where to download it (GET, signed in or with a token).',
      resolve: (a) => `/api/train/jobs/${a.jobId}/artifacts/${a.kind}`,
    }),
    files: t.field({
      type: [ArtifactFile],
      description: "For peft: the tar's files, as checked.",
      resolve: (a: TrainArtifact) =>
        Array.isArray(a.files) ? (a.files as { name: string; size: number; sha256: string }[]) : [],
    }),
  }),
});

export const TrainJobRef = builder.prismaObject('TrainJob', {
  description: 'A LoRA adapter being trained on a node: its inputs, live progress, what it made.',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name', { description: "The adapter's name: what requests will ask for." }),
    model: t.exposeString('model', { description: 'The catalog model the adapter is for.' }),
    baseRepo: t.exposeString('baseRepo'),
    baseRevision: t.exposeString('baseRevision', { nullable: true }),
    node: t.relation('node', { nullable: true }),
    owner: t.exposeString('owner', { nullable: true, description: 'scope:id; null when the adapter is public.' }),
    ownerLabel: t.string({
      nullable: true,
      description: 'The owner as a person reads it: team:acme/research.',
      resolve: (j, _args, ctx) => ownerName(ctx, j.owner),
    }),
    ownerName: t.string({
      nullable: true,
      description: 'The owner as people read it, as on every other page: "team:acme/support"; null when public.',
      resolve: (j, _args, ctx) => ownerName(ctx, j.owner),
    }),
    gpuMiB: t.exposeInt('gpuMiB'),
    params: t.expose('params', { type: 'JSON' }),
    gguf: t.exposeBoolean('gguf', { description: 'Whether a llama.cpp GGUF adapter is made from the result.' }),
    pairs: t.exposeInt('pairs'),
    dataSha256: t.exposeString('dataSha256'),
    dataBytes: t.field({ type: 'Bytes', resolve: (j) => j.dataBytes }),
    state: t.field({ type: JobStateEnum, resolve: (j) => j.state }),
    step: t.exposeInt('step'),
    steps: t.exposeInt('steps'),
    progress: t.float({
      description: 'step / steps, 0 to 1 (1 once done).',
      resolve: (j) => (j.state === 'DONE' ? 1 : j.steps > 0 ? Math.min(1, j.step / j.steps) : 0),
    }),
    loss: t.exposeFloat('loss', { nullable: true }),
    peakMiB: t.exposeInt('peakMiB', { nullable: true }),
    message: t.exposeString('message', {
      nullable: true,
      description: 'What it is doing, why it waits, or why it failed.',
    }),
    cancelRequested: t.boolean({ resolve: (j) => j.cancelRequestedAt !== null }),
    createdBy: t.string({
      nullable: true,
      resolve: async (j, _args, ctx, info) => {
        const by = j.createdById;
        if (!by) return null;
        const user = await sharedField(j, info, 'createdBy', () => userById(ctx.prisma, by));
        return user?.email ?? null;
      },
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    startedAt: t.expose('startedAt', { type: 'DateTime', nullable: true }),
    finishedAt: t.expose('finishedAt', { type: 'DateTime', nullable: true }),
    updatedAt: t.expose('updatedAt', { type: 'DateTime' }),
    metrics: t.field({
      type: [TrainMetricRef],
      description: 'The loss curve, in step order: the last `last` steps reported (default and at most 5000).',
      args: { last: t.arg.int({ required: false }) },
      // The newest N, then put back in order: a long run's chart shows where it is now.
      resolve: async (job, args, ctx, info) => {
        const take = Math.min(Math.max(args.last ?? 5000, 1), 5000);
        const newest = await sharedField(job, info, `metrics:${take}`, () =>
          ctx.prisma.trainMetric.findMany({ where: { jobId: job.id }, orderBy: { step: 'desc' }, take }),
        );
        // A copy: the list read may be shared with other subscribers of the same event.
        return newest.toReversed();
      },
    }),
    events: t.relation('events', { query: { orderBy: { at: 'asc' }, take: 500 } }),
    artifacts: t.relation('artifacts', { query: { orderBy: { kind: 'asc' } } }),
    adapter: t.field({
      type: 'String',
      nullable: true,
      description: 'The catalog adapter it was published as, if it was.',
      resolve: async (j, _args, ctx, info) =>
        (await sharedField(j, info, 'adapter', () => adapterOfJob(ctx.prisma, j.id)))?.name ?? null,
    }),
  }),
});

const TrainJobEdge = builder.objectRef<TrainJob>('TrainJobEdge').implement({
  fields: (t) => ({
    cursor: t.string({ resolve: (j) => j.id }),
    node: t.field({ type: TrainJobRef, resolve: (j) => j }),
  }),
});

export const TrainJobConnection = builder
  .objectRef<{ rows: TrainJob[]; hasNextPage: boolean }>('TrainJobConnection')
  .implement({
    fields: (t) => ({
      edges: t.field({ type: [TrainJobEdge], resolve: (c) => c.rows }),
      pageInfo: t.field({
        type: PageInfo,
        resolve: (c) => ({ hasNextPage: c.hasNextPage, endCursor: c.rows.at(-1)?.id ?? null }),
      }),
    }),
  });

const LengthStatsRef = builder.objectRef<NonNullable<TrainDataReport['question']>>('LengthStats').implement({
  description: 'Lengths in characters.',
  fields: (t) => ({
    min: t.exposeInt('min'),
    max: t.exposeInt('max'),
    mean: t.exposeFloat('mean'),
    p50: t.exposeInt('p50'),
    p95: t.exposeInt('p95'),
  }),
});

const TokenStatsRef = builder.objectRef<NonNullable<TrainDataReport['tokens']>>('TrainDataTokens').implement({
  description: "The pairs' lengths in tokens, by the model's own tokenizer (llama.cpp, vocabulary only).",
  fields: (t) => ({
    model: t.exposeString('model'),
    question: t.field({ type: LengthStatsRef, resolve: (s) => s.question }),
    answer: t.field({ type: LengthStatsRef, resolve: (s) => s.answer }),
    pair: t.field({ type: LengthStatsRef, description: 'Question and answer together.', resolve: (s) => s.pair }),
    maxLen: t.exposeInt('maxLen'),
    overMaxLen: t.exposeInt('overMaxLen', {
      description: 'Pairs over max_len tokens: the trainer cuts or drops them.',
    }),
  }),
});

const LineProblem = builder.objectRef<{ line: number; message: string }>('TrainDataLineError').implement({
  fields: (t) => ({ line: t.exposeInt('line'), message: t.exposeString('message') }),
});
const Duplicate = builder.objectRef<{ line: number; sameAs: number }>('TrainDataDuplicate').implement({
  fields: (t) => ({ line: t.exposeInt('line'), sameAs: t.exposeInt('sameAs') }),
});

export const TrainDataReportRef = builder.objectRef<TrainDataReport>('TrainDataReport').implement({
  description: 'The pairs as createTrainJob will read them: count, bad lines, duplicates, lengths.',
  fields: (t) => ({
    pairs: t.exposeInt('pairs'),
    bytes: t.field({ type: 'Bytes', resolve: (r) => r.bytes }),
    sha256: t.exposeString('sha256'),
    ok: t.boolean({
      description: 'Whether createTrainJob would take it.',
      resolve: (r) => r.errorCount === 0 && r.pairs > 0,
    }),
    errors: t.field({ type: [LineProblem], description: 'The first bad lines.', resolve: (r) => r.errors }),
    errorCount: t.exposeInt('errorCount'),
    duplicates: t.field({ type: [Duplicate], resolve: (r) => r.duplicates }),
    duplicateCount: t.exposeInt('duplicateCount'),
    collections: t.exposeStringList('collections', { description: 'The knowledge-base collections the pairs name.' }),
    question: t.field({ type: LengthStatsRef, nullable: true, resolve: (r) => r.question }),
    answer: t.field({ type: LengthStatsRef, nullable: true, resolve: (r) => r.answer }),
    tokens: t.field({
      type: TokenStatsRef,
      nullable: true,
      description: "Lengths in the model's own tokens, when a model was named and its GGUF is in the mirror.",
      resolve: (r) => r.tokens,
    }),
    tokensNote: t.exposeString('tokensNote', { nullable: true, description: 'Why there are no token counts.' }),
  }),
});

type ParamRow = { name: string; min: number; max: number; whole: boolean; default: number; about: string };
export const TrainParamRef = builder.objectRef<ParamRow>('TrainParam').implement({
  description: 'One trainer setting and what it may be: the console builds its form from these.',
  fields: (t) => ({
    name: t.exposeString('name'),
    min: t.exposeFloat('min'),
    max: t.exposeFloat('max'),
    whole: t.exposeBoolean('whole'),
    default: t.exposeFloat('default'),
    about: t.exposeString('about'),
  }),
});
