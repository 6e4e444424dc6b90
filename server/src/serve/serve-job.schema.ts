import { filter, pipe } from 'graphql-yoga';
import { NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';

export const JobStateEnum = builder.enumType('JobState', {
  values: ['QUEUED', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED'] as const,
});

const ServeJobStepRef = builder.prismaObject('ServeJobStep', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name', { description: 'registry, mirror, check, catalog, replica or smoke.' }),
    state: t.field({ type: JobStateEnum, resolve: (s) => s.state }),
    message: t.exposeString('message', { nullable: true }),
    startedAt: t.expose('startedAt', { type: 'DateTime', nullable: true }),
    finishedAt: t.expose('finishedAt', { type: 'DateTime', nullable: true }),
  }),
});

export const ServeJobRef = builder.prismaObject('ServeJob', {
  description: 'Serving a model from the registry in one step: each step, live.',
  fields: (t) => ({
    id: t.exposeID('id'),
    repo: t.exposeString('repo'),
    quant: t.exposeString('quant', { nullable: true }),
    file: t.exposeString('file', { nullable: true }),
    onDemand: t.exposeBoolean('onDemand'),
    state: t.field({ type: JobStateEnum, resolve: (j) => j.state }),
    message: t.exposeString('message', { nullable: true }),
    createdBy: t.exposeString('createdBy', { nullable: true }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    finishedAt: t.expose('finishedAt', { type: 'DateTime', nullable: true }),
    steps: t.relation('steps', { type: ServeJobStepRef, query: { orderBy: { position: 'asc' } } }),
  }),
});

builder.queryField('serveJob', (t) =>
  t.prismaField({
    type: 'ServeJob',
    nullable: true,
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: true }) },
    resolve: (query, _root, args, ctx) =>
      /^[0-9a-f-]{36}$/i.test(String(args.id))
        ? ctx.prisma.serveJob.findUnique({ ...query, where: { id: String(args.id) } })
        : null,
  }),
);

builder.mutationField('serveFromRegistry', (t) =>
  t.field({
    type: ServeJobRef,
    description:
      'Starts a job: registry → mirror → check → catalog → replica → smoke test. Watch it with serveJobChanged.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: {
      repo: t.arg.string({ required: true }),
      quant: t.arg.string({
        required: false,
        description:
          'The set to serve, by quantisation (default: the first of Q4_K_M, Q5_K_M, Q6_K, Q8_0, … that fits on a node now).',
      }),
      file: t.arg.string({ required: false, description: 'Or the set holding this file.' }),
      onDemand: t.arg.boolean({ required: false, description: 'Add it on demand: no replica starts until asked.' }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.serveJobs.create(ctx.actor, args)),
  }),
);

builder.subscriptionField('serveJobChanged', (t) =>
  t.field({
    type: ServeJobRef,
    authScopes: { viewer: true },
    args: { id: t.arg.id({ required: true }) },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.pubsub.subscribe('serveJob'),
        filter((id: string) => id === String(args.id)),
      ),
    resolve: (id: string, _args, ctx) =>
      ctx.pubsub.shared('serveJob', id, 'withSteps', () =>
        ctx.prisma.serveJob.findUniqueOrThrow({ where: { id }, include: { steps: true } }),
      ),
  }),
);
