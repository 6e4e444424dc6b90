import { filter, pipe } from 'graphql-yoga';
import type { Context } from '../context.js';
import { currentReplicas } from '../fleet/current.js';
import { ReplicaRef } from '../fleet/fleet.schema.js';
import type { CatalogModel } from '../generated/prisma/client.js';
import { ConflictError, NotFoundError, UpstreamError, unwrap, ValidationError } from '../lib/errors.js';
import { ModelMode } from '../mirror/mirror.schema.js';
import { ownerName } from '../org/org.schema.js';
import { ownerFilter, seenOnly, sees, sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import { memoryEstimateError, modeMessage, modeOf, type ServePlan } from './catalog.service.js';

// ALWAYS keeps N replicas; ON_DEMAND starts one when asked and stops it when idle; STOPPED runs none.
const ModelModeRef = ModelMode;

const RoutingPolicyRef = builder.enumType('RoutingPolicy', {
  description: 'How the gateway picks a replica of a model for a request.',
  values: {
    LEAST_LOADED: { description: 'The replica with the fewest requests in flight.' },
    PREFIX: {
      description:
        "A session key (prompt_cache_key, x-session-id, user) or else the prompt's start names the replica that holds it cached, while it has room (HANGAR_GATEWAY_LOAD_FACTOR). The default.",
    },
    SESSION: {
      description: 'A session key names the replica while it has room; requests without one go to the least loaded.',
    },
  } as const,
});
const EngineRef = builder.enumType('Engine', { values: ['llamacpp', 'vllm'] as const });

const AdapterRef = builder.prismaObject('Adapter', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    source: t.exposeString('source'),
    owner: t.exposeString('owner', { nullable: true, description: 'scope:id; null is every caller the model allows.' }),
    ownerName: t.string({
      nullable: true,
      description: 'The owner as people read it: "team:acme/support"; null is every caller the model allows.',
      resolve: (a, _args, ctx) => ownerName(ctx, a.owner),
    }),
    trainJobId: t.exposeID('trainJobId', { nullable: true, description: 'The training job that made it, if one did.' }),
    artifactSha256: t.exposeString('artifactSha256', {
      nullable: true,
      description: 'The sha256 of what was published (the GGUF, or the PEFT tar): lineage that outlives the job.',
    }),
  }),
});

const DeclaredIn = builder.objectRef<{ file: string; key: string }>('DeclaredIn').implement({
  description: 'Where in hangar.yaml a declared model is: the file, and its entry under models.',
  fields: (t) => ({
    file: t.exposeString('file'),
    key: t.exposeString('key', { description: 'The entry, as "models.2": its mode is models.2.mode.' }),
  }),
});

export const CatalogModelRef = builder.prismaObject('CatalogModel', {
  name: 'Model',
  description: 'What the fleet serves.',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    source: t.exposeString('source'),
    engine: t.field({ type: EngineRef, resolve: (m) => m.engine }),
    contextSize: t.exposeInt('contextSize', { nullable: true }),
    memoryBytes: t.field({
      type: 'Bytes',
      nullable: true,
      description: "The plan's estimate of the memory one replica needs (weights, KV cache, compute) at contextSize.",
      resolve: (m) => m.memoryBytes,
    }),
    measuredMemoryBytes: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'What a fully offloaded replica really held on its GPU after loading, as last reported.',
      resolve: (m) => m.measuredMemoryBytes,
    }),
    measuredAt: t.expose('measuredAt', { type: 'DateTime', nullable: true }),
    memoryEstimateError: t.float({
      nullable: true,
      description:
        'How far the estimate was off: (measured − estimated) / estimated; 0.1 = the replica held 10% more than planned. Null until a GPU replica has reported.',
      resolve: (m) => memoryEstimateError(m),
    }),
    parallel: t.exposeInt('parallel', {
      description: 'Requests one replica answers at once (1–64); more wait in its queue.',
    }),
    mode: t.field({ type: ModelModeRef, resolve: (m) => modeOf(m) }),
    routing: t.field({
      type: RoutingPolicyRef,
      description: 'How the gateway picks a replica for its requests (setModelRouting).',
      resolve: (m) => m.routing,
    }),
    fallbacks: t.exposeStringList('fallbacks', {
      description:
        'Models that answer in its place when it cannot, in order (setModelFallbacks); a caller is sent only to those they may call.',
    }),
    wantedReplicas: t.int({
      description: 'Replicas kept (ALWAYS) or at most (ON_DEMAND); 0 when stopped.',
      resolve: (m) => m.maxReplicas,
    }),
    declared: t.exposeBoolean('declared', { description: 'Read from hangar.yaml: change it there, not here.' }),
    declaredIn: t.field({
      type: DeclaredIn,
      nullable: true,
      description:
        'Where a declared model is changed: the file and its entry ("models.2"), so its mode is models.2.mode there. Null for a model made here.',
      resolve: (m, _args, ctx) => (m.declared ? ctx.services.catalog.declaredIn(m.name) : null),
    }),
    modeMessage: t.string({
      description:
        'What the mode means now, what happens next after a change: "stopped; its replicas are being taken down", "on demand: starts when a request asks for it, stops after 15 minutes unused", "always: 2 replicas are being placed".',
      select: (_args, _ctx, nested) => ({
        minReplicas: true,
        maxReplicas: true,
        idleSeconds: true,
        replicas: nested({ select: { state: true, desired: true } }),
      }),
      resolve: (m) => modeMessage(m, m.replicas),
    }),
    owner: t.string({
      nullable: true,
      description:
        'Who may call it at /v1, as "team:acme/research" or "user:alice@example.com"; null is every caller. Its adapters are narrowed by their own owners.',
      resolve: (m, _args, ctx) => ownerName(ctx, m.owner),
    }),
    ownerName: t.string({
      nullable: true,
      description: 'The owner as people read it, as on every other page: "team:acme/support"; null is every caller.',
      resolve: (m, _args, ctx) => ownerName(ctx, m.owner),
    }),
    adapters: t.field({
      type: [AdapterRef],
      description: 'Its adapters the caller may call (an owned one only for those its owner admits; admins all).',
      select: (_args, _ctx, nested) => ({ adapters: nested({}) }),
      resolve: async (m, _args, ctx, info) => seenOnly(await sightOf(ctx, info), m.adapters, (a) => a.owner),
    }),
    replicas: t.field({
      type: [ReplicaRef],
      description:
        'Its replicas as they stand: placed, loading or serving, and a failed or lost one while it is why fewer serve than wanted. Stopped ones are not listed (the audit log has what happened).',
      select: (_args, _ctx, nested) => ({
        minReplicas: true,
        maxReplicas: true,
        awakeUntil: true,
        replicas: nested({ orderBy: { createdAt: 'asc' } }),
      }),
      resolve: (m) => currentReplicas(m, m.replicas),
    }),
    awakeUntil: t.expose('awakeUntil', {
      type: 'DateTime',
      nullable: true,
      description: 'An on-demand model woken with wakeModel runs until then.',
    }),
    lastRequestAt: t.expose('lastRequestAt', {
      type: 'DateTime',
      nullable: true,
      description: 'The last request the gateway routed to it (written in batches, so up to a few seconds late).',
    }),
    idleSeconds: t.exposeInt('idleSeconds', {
      description: 'An on-demand model stops this long after its last request (or its wake, with none since).',
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
  }),
});

const NodeFitPlan = builder.objectRef<ServePlan['fitsOn'][number]>('PlanFit').implement({
  fields: (t) => ({ node: t.exposeString('node'), fits: t.exposeBoolean('fits'), reason: t.exposeString('reason') }),
});

const ServePlanRef = builder.objectRef<ServePlan>('ServePlan').implement({
  description: 'What serving a mirrored version would mean, shown before it is confirmed.',
  fields: (t) => ({
    name: t.exposeString('name'),
    engine: t.field({ type: EngineRef, resolve: (p) => p.engine }),
    source: t.exposeString('source'),
    architecture: t.exposeString('architecture', { nullable: true }),
    servable: t.boolean({ nullable: true, resolve: (p) => p.verdict?.servable ?? null }),
    verdict: t.string({ nullable: true, resolve: (p) => p.verdict?.reason ?? null }),
    context: t.int({ nullable: true, resolve: (p) => p.memory?.context ?? null }),
    memoryBytes: t.field({ type: 'Bytes', nullable: true, resolve: (p) => p.memory?.totalBytes ?? null }),
    fitsOn: t.field({ type: [NodeFitPlan], resolve: (p) => p.fitsOn }),
  }),
});

const ServePlaced = builder
  .objectRef<{ model: CatalogModel; plan: ServePlan; message: string }>('ServePlaced')
  .implement({
    description: 'The model is in the catalog; replicas are placed on the next pass (nothing is serving yet).',
    fields: (t) => ({
      model: t.field({ type: CatalogModelRef, resolve: (r) => r.model }),
      plan: t.field({ type: ServePlanRef, resolve: (r) => r.plan }),
      message: t.exposeString('message'),
    }),
  });

const RemovedModel = builder
  .objectRef<{ name: string }>('RemovedModel')
  .implement({ fields: (t) => ({ name: t.exposeString('name') }) });

builder.queryFields((t) => ({
  models: t.prismaField({
    type: ['CatalogModel'],
    authScopes: { viewer: true },
    description: 'The models the caller may call at /v1 (an owned one only for those its owner admits; admins all).',
    resolve: async (query, _root, _args, ctx, info) =>
      ctx.prisma.catalogModel.findMany({
        ...query,
        where: ownerFilter(await sightOf(ctx, info)),
        orderBy: { name: 'asc' },
      }),
  }),
  model: t.prismaField({
    type: 'CatalogModel',
    nullable: true,
    description: 'Null for a model the caller may not call, as for one that does not exist.',
    authScopes: { viewer: true },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (query, _root, args, ctx, info) =>
      ctx.prisma.catalogModel.findFirst({
        ...query,
        where: { name: args.name, ...ownerFilter(await sightOf(ctx, info)) },
      }),
  }),
  servePlan: t.field({
    type: ServePlanRef,
    authScopes: { viewer: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      model: t.arg.string({ required: true }),
      version: t.arg.string({ required: true }),
      name: t.arg.string({ required: false }),
      context: t.arg.int({ required: false }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.plan(args, ctx.viewer)),
  }),
}));

builder.mutationFields((t) => ({
  serveMirrorVersion: t.field({
    type: ServePlaced,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError, UpstreamError] },
    args: {
      model: t.arg.string({ required: true }),
      version: t.arg.string({ required: true }),
      name: t.arg.string({ required: false, description: "The catalog name; default the mirror's model name." }),
      context: t.arg.int({ required: false }),
      mode: t.arg({ type: ModelModeRef, required: false }),
      replicas: t.arg.int({ required: false }),
      parallel: t.arg.int({ required: false, description: 'Requests one replica answers at once, 1–64; default 1.' }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.serveMirrorVersion(ctx.actor, args)),
  }),
  setModelMode: t.field({
    type: CatalogModelRef,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      name: t.arg.string({ required: true }),
      mode: t.arg({ type: ModelModeRef, required: true }),
      replicas: t.arg.int({ required: false }),
      parallel: t.arg.int({
        required: false,
        description:
          'Requests one replica answers at once, 1–64; unchanged when absent. Replicas started after take it.',
      }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.setMode(ctx.actor, args)),
  }),
  setModelOwner: t.field({
    type: CatalogModelRef,
    description:
      "Restricts who may call the model at /v1 to the callers an owner admits (its members, or that user or key); null makes it every caller's again.",
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      name: t.arg.string({ required: true }),
      owner: t.arg.string({
        required: false,
        description:
          'org:<name or id>, team:<org/team or id>, project:<org/team/project or id>, user:<email or id> or key:<API token id>; null for every caller.',
      }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.setOwner(ctx.actor, args)),
  }),
  wakeModel: t.field({
    type: CatalogModelRef,
    description: 'Starts an on-demand model now; it stops again after its idle time.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.wake(ctx.actor, args)),
  }),
  setModelRouting: t.field({
    type: CatalogModelRef,
    description:
      "How the gateway picks a replica for the model's requests: PREFIX keeps a conversation where its prompt is cached, SESSION only pins a session key, LEAST_LOADED spreads.",
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: { name: t.arg.string({ required: true }), policy: t.arg({ type: RoutingPolicyRef, required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.setRouting(ctx.actor, args)),
  }),
  setModelFallbacks: t.field({
    type: CatalogModelRef,
    description:
      'The models, in order, that answer in its place when it has no ready replica in time or every replica failed before answering; each only for callers who may call it. [] removes them.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: { name: t.arg.string({ required: true }), fallbacks: t.arg.stringList({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.setFallbacks(ctx.actor, args)),
  }),
  removeModel: t.field({
    type: RemovedModel,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.remove(ctx.actor, args)),
  }),
}));

type ModelChange = { id: string; model: CatalogModel | null };

/** A model as an event found it: one read for every subscriber of the event (pubsub.ts: shared). */
function modelRow(ctx: Context, id: string) {
  return ctx.pubsub.shared('model', id, 'model', () => ctx.prisma.catalogModel.findUnique({ where: { id } }));
}
const ModelChangeRef = builder.objectRef<ModelChange>('ModelChange').implement({
  description: 'A catalog model as it is now, or that it was removed (model null).',
  fields: (t) => ({
    modelId: t.id({ resolve: (c) => c.id }),
    model: t.field({ type: CatalogModelRef, nullable: true, resolve: (c) => c.model }),
  }),
});

// The Models page follows this as the Mirror page follows mirrorChanged: a model, its replicas or adapters written
// anywhere (the catalog, placement, an agent's report, a smoke test, the gateway) is one event from the database.
builder.subscriptionFields((t) => ({
  modelChanged: t.field({
    type: ModelChangeRef,
    description: 'Every catalog model that changes (it, a replica or an adapter), whole; model null once removed.',
    authScopes: { viewer: true },
    // A model the subscriber may not call is not sent (a removed one is: its id says nothing).
    subscribe: (_root, _args, ctx) =>
      pipe(
        ctx.pubsub.subscribe('model'),
        filter(async (id: string) => {
          const model = await modelRow(ctx, id);
          return model === null || sees(await sightOf(ctx), model.owner);
        }),
      ),
    resolve: async (id: string, _args, ctx) => ({ id, model: await modelRow(ctx, id) }),
  }),
}));
