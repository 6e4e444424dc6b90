import type { TrainEvaluation } from '../generated/prisma/client.js';
import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import type { EvalMetric, ScoredQuestion } from './eval-score.js';
import { DEFAULT_EVAL_SHARE, heldOutCount } from './eval-split.js';
import { TrainDataReportRef, TrainJobRef } from './train.types.js';

// How a job's adapter compared with its base on questions it was not trained on (eval-*.ts): on the job, on the
// published adapter (the model page), and the node's report of the answers. Names for scripts: keep them.

export const EvalVerdictEnum = builder.enumType('EvalVerdict', {
  description:
    'BETTER or WORSE when the 95 % interval of the difference (adapter − base, over the questions) lies wholly on one side of 0 for token F1 or the log-likelihood of the reference, by more than 0.02 F1 or 0.05 nats per token; INSUFFICIENT_DATA with fewer than 5 questions.',
  values: ['BETTER', 'WORSE', 'NO_CLEAR_DIFFERENCE', 'INSUFFICIENT_DATA'] as const,
});

const EvalMetricRef = builder.objectRef<EvalMetric>('EvalMetric').implement({
  description:
    'One measure for the base and the adapter over the same questions, with the difference and its 95 % interval.',
  fields: (t) => ({
    set: t.exposeString('set', { description: 'pairs (the held-out pairs) or general (the forgetting check).' }),
    name: t.exposeString('name', {
      description: 'tokenF1, exactMatch, rougeL, logLikelihood (per token), perplexity.',
    }),
    base: t.exposeFloat('base'),
    adapter: t.exposeFloat('adapter'),
    difference: t.exposeFloat('difference', { description: 'adapter − base.' }),
    low: t.exposeFloat('low', { description: 'The 95 % bootstrap interval of the difference, over the questions.' }),
    high: t.exposeFloat('high'),
  }),
});

const EvalQuestionRef = builder.objectRef<ScoredQuestion>('EvalQuestion').implement({
  description: 'One question as both models answered it (greedy, the same seed).',
  fields: (t) => ({
    set: t.exposeString('set'),
    question: t.exposeString('question'),
    reference: t.exposeString('reference'),
    baseAnswer: t.exposeString('baseAnswer'),
    adapterAnswer: t.exposeString('adapterAnswer'),
    baseF1: t.exposeFloat('baseF1'),
    adapterF1: t.exposeFloat('adapterF1'),
    baseLogLikelihood: t.exposeFloat('baseLogLikelihood'),
    adapterLogLikelihood: t.exposeFloat('adapterLogLikelihood'),
  }),
});

type EvalView = TrainEvaluation & { mayReadPairs: boolean };

const TrainEvaluationRef = builder.objectRef<EvalView>('TrainEvaluation').implement({
  description: 'How the adapter compared with its base on held-out questions, scored on the node after training.',
  fields: (t) => ({
    heldOut: t.exposeInt('heldOut', { description: 'Held-out pairs the two models answered.' }),
    seed: t.exposeInt('seed', { description: 'The seed that picked them and drew the intervals.' }),
    verdict: t.field({ type: EvalVerdictEnum, resolve: (e) => e.verdict as never }),
    forgettingVerdict: t.field({
      type: EvalVerdictEnum,
      description: 'The same comparison on general questions unrelated to the pairs: WORSE means it forgot.',
      resolve: (e) => e.forgettingVerdict as never,
    }),
    metrics: t.field({ type: [EvalMetricRef], resolve: (e) => e.metrics as EvalMetric[] }),
    questions: t.field({
      type: [EvalQuestionRef],
      description:
        "Side by side. The held-out pairs only for those who may read the job's pairs; the general ones for all.",
      resolve: (e) => (e.questions as ScoredQuestion[]).filter((q) => e.mayReadPairs || q.set === 'general'),
    }),
    at: t.expose('at', { type: 'DateTime' }),
  }),
});

builder.prismaObjectField('TrainJob', 'evaluation', (t) =>
  t.field({
    type: TrainEvaluationRef,
    nullable: true,
    description: 'Null until the node has evaluated the adapter (after training), or when it could not.',
    resolve: async (job, _args, ctx) => {
      const e = await ctx.services.train.evaluations.get(job.id);
      return e ? { ...e, mayReadPairs: await ctx.services.train.mayReadData(ctx.viewer, job) } : null;
    },
  }),
);

builder.prismaObjectField('TrainJob', 'heldOut', (t) =>
  t.int({
    description: 'Pairs set aside to evaluate the adapter, never trained on (0 with an evaluation file).',
    resolve: (job) => job.heldOutLines.length,
  }),
);

builder.prismaObjectField('TrainMetric', 'evalLoss', (t) =>
  t.exposeFloat('evalLoss', { nullable: true, description: 'The loss on the held-out pairs, at evaluation steps.' }),
);

builder.objectField(TrainDataReportRef, 'heldOut', (t) =>
  t.int({
    description: 'How many pairs a job holds out to evaluate its adapter at the default share (10 %, at least 5).',
    resolve: (r) => heldOutCount(r.pairs, DEFAULT_EVAL_SHARE),
  }),
);

builder.prismaObjectField('Adapter', 'evaluation', (t) =>
  t.field({
    type: TrainEvaluationRef,
    nullable: true,
    description: 'How it compared with its base when it was trained, kept after its job is deleted.',
    resolve: async (adapter, _args, ctx) => {
      if (!adapter.trainJobId) return null;
      const e = await ctx.services.train.evaluations.get(adapter.trainJobId);
      // The held-out pairs are the job's owner's: shown to callers the adapter's owner admits as operators.
      const job = { nodeId: null, owner: adapter.owner };
      return e ? { ...e, mayReadPairs: await ctx.services.train.mayReadData(ctx.viewer, job) } : null;
    },
  }),
);

const EvalAnswerInput = builder.inputType('TrainEvalAnswerInput', {
  fields: (t) => ({
    set: t.string({ required: true, description: 'pairs or general.' }),
    question: t.string({ required: true }),
    reference: t.string({ required: true }),
    baseAnswer: t.string({ required: true }),
    adapterAnswer: t.string({ required: true }),
    baseLogLikelihood: t.float({ required: true, description: 'Per token of the reference, natural log.' }),
    adapterLogLikelihood: t.float({ required: true }),
  }),
});
const EvalReportInput = builder.inputType('TrainEvaluationInput', {
  fields: (t) => ({ answers: t.field({ type: [EvalAnswerInput], required: true }) }),
});

builder.mutationFields((t) => ({
  reportTrainEvaluation: t.field({
    type: TrainJobRef,
    description:
      "A node agent reports the base's and the adapter's answers to the held-out questions (node token only).",
    authScopes: { node: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: EvalReportInput, required: true }) },
    resolve: async (_root, args, ctx) => {
      unwrap(await ctx.services.train.evaluations.record(ctx.actor, String(args.id), args.input));
      return (await ctx.services.train.get(String(args.id))) as NonNullable<
        Awaited<ReturnType<typeof ctx.services.train.get>>
      >;
    },
  }),
}));
