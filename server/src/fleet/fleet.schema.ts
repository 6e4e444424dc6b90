import type { Context } from '../context.js';
import type { Node } from '../generated/prisma/client.js';
import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { seenOnly, sees, sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import { currentOnNode } from './current.js';
import { bookedShare, cardsOf, heldByReplica } from './gpu-room.js';
import { type NodeEngine, type NodeGpu, nodeEngines, nodeGpus } from './node-inventory.js';
import { servingWorkOf } from './serving-work.js';

const Gpu = builder.objectRef<NodeGpu>('Gpu').implement({
  fields: (t) => ({
    index: t.exposeInt('index'),
    name: t.exposeString('name'),
    totalMiB: t.exposeInt('totalMiB'),
    freeMiB: t.exposeInt('freeMiB'),
  }),
});

const EngineInfo = builder.objectRef<NodeEngine>('EngineInfo').implement({
  fields: (t) => ({
    name: t.exposeString('name'),
    version: t.exposeString('version', { nullable: true }),
    build: t.exposeInt('build', {
      nullable: true,
      description: "llama.cpp's build number, which decides what it loads.",
    }),
  }),
});

type ReplicaCardShape = { index: number; name: string; totalBytes: number; heldBytes: number; measured: boolean };
const ReplicaCard = builder.objectRef<ReplicaCardShape>('ReplicaCard').implement({
  description: 'One GPU a replica sits on, and what it holds there.',
  fields: (t) => ({
    index: t.exposeInt('index', { description: 'The GPU as its agent numbers them.' }),
    name: t.exposeString('name', { description: 'The GPU as its agent reported it ("RTX 4090").' }),
    totalBytes: t.field({ type: 'Bytes', description: "The card's memory in all.", resolve: (c) => c.totalBytes }),
    heldBytes: t.field({
      type: 'Bytes',
      description: "The replica's share on this card: measured once loaded (measured), planned before.",
      resolve: (c) => c.heldBytes,
    }),
    measured: t.exposeBoolean('measured', { description: 'Whether heldBytes was measured by its agent.' }),
  }),
});

const AgentEnvVar = builder.objectRef<{ name: string; value: string }>('AgentEnvVar').implement({
  fields: (t) => ({ name: t.exposeString('name'), value: t.exposeString('value') }),
});

export const NodeRef = builder.prismaObject('Node', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    online: t.boolean({ resolve: (n, _args, ctx) => ctx.services.fleet.isOnline(n) }),
    lastSeenAt: t.expose('lastSeenAt', { type: 'DateTime', nullable: true }),
    gpus: t.field({ type: [Gpu], resolve: nodeGpus }),
    engines: t.field({ type: [EngineInfo], resolve: nodeEngines }),
    diskFreeBytes: t.field({ type: 'Bytes', nullable: true, resolve: (n) => n.diskFreeBytes }),
    agentVersion: t.exposeString('agentVersion', { nullable: true }),
    leftAt: t.expose('leftAt', {
      type: 'DateTime',
      nullable: true,
      description:
        'When its agent said it was stopping, or its token was revoked: offline from then until it reports again.',
    }),
    tokenChangedAt: t.expose('tokenChangedAt', {
      type: 'DateTime',
      nullable: true,
      description: 'When its token was last rotated or revoked; the one before is refused since.',
    }),
    tokenRevoked: t.boolean({
      description: 'Its token was revoked and no new one made: its agent is refused until rotateNodeToken.',
      resolve: (n) => n.tokenRevokedAt !== null,
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    replicas: t.field({
      type: [ReplicaRef],
      description:
        'The replicas placed on it, loading or serving, and one that failed here lately (stopped ones are not).',
      // Each with its model's owner: a replica of a model the caller may not call is not listed (its name would be).
      select: (_args, _ctx, nested) => ({
        replicas: nested({ orderBy: { createdAt: 'asc' }, include: { model: { select: { owner: true } } } }),
      }),
      resolve: async (n, _args, ctx, info) =>
        currentOnNode(seenOnly(await sightOf(ctx, info), n.replicas, (r) => r.model.owner)),
    }),
  }),
});

const CreatedNode = builder.objectRef<{ node: Node; token: string }>('CreatedNode').implement({
  fields: (t) => ({
    node: t.field({ type: NodeRef, resolve: (p) => p.node }),
    token: t.exposeString('token', {
      description: "The agent's node token (HANGAR_NODE_TOKEN). Shown this once: Hangar keeps only its hash.",
    }),
    agentEnv: t.field({
      type: [AgentEnvVar],
      description:
        'What the agent on the node needs to start: HANGAR_URL (this server as sources name it) and HANGAR_NODE_TOKEN.',
      resolve: (p, _args, ctx) => [
        { name: 'HANGAR_URL', value: ctx.services.fleet.agentUrl() },
        { name: 'HANGAR_NODE_TOKEN', value: p.token },
      ],
    }),
    agentCommand: t.string({
      description: 'The command line that starts its agent, run from a checkout of Hangar on the node.',
      resolve: (p, _args, ctx) =>
        `HANGAR_URL=${ctx.services.fleet.agentUrl()} HANGAR_NODE_TOKEN=${p.token} node packages/agent/bin/hangar-agent.mjs`,
    }),
  }),
});

const ReplicaStateEnum = builder.enumType('ReplicaState', {
  values: ['PENDING', 'LOADING', 'READY', 'FAILED', 'STOPPED', 'LOST'] as const,
});
const ReplicaDesiredEnum = builder.enumType('ReplicaDesired', { values: ['RUN', 'STOP'] as const });

export const ReplicaRef = builder.prismaObject('Replica', {
  description:
    'One copy of a model on a node: where it runs, how it is doing, and why it is not running when it is not.',
  fields: (t) => ({
    id: t.exposeID('id'),
    model: t.relation('model'),
    node: t.relation('node', { nullable: true }),
    state: t.field({ type: ReplicaStateEnum, resolve: (r) => r.state }),
    desired: t.field({ type: ReplicaDesiredEnum, resolve: (r) => r.desired }),
    message: t.exposeString('message', { nullable: true, description: 'Why it is pending, failed or lost.' }),
    smokeText: t.exposeString('smokeText', {
      nullable: true,
      description: "The smoke test's answer: one short chat request through the endpoint with the engine key.",
    }),
    tokensPerSecond: t.exposeFloat('tokensPerSecond', {
      nullable: true,
      description: "The smoke test's generation speed after its first token.",
    }),
    timeToFirstTokenMs: t.exposeFloat('timeToFirstTokenMs', {
      nullable: true,
      description: "The smoke test's time from sending the request to the first piece of the answer, in ms.",
    }),
    smokedAt: t.expose('smokedAt', { type: 'DateTime', nullable: true, description: 'When the smoke test passed.' }),
    endpoint: t.exposeString('endpoint', {
      nullable: true,
      // Where to send requests around the gateway is an operator's business; a viewer sees null.
      authScopes: { operator: true },
      unauthorizedResolver: () => null,
      description:
        "The replica's OpenAI base URL on its node, as its agent advertises it (OPERATOR and above; null for viewers). Requests need its engine key, which only the control plane holds.",
    }),
    gpuLayers: t.exposeInt('gpuLayers', {
      nullable: true,
      description: 'Layers the replica holds on the GPU, as its agent measured after loading; null when unknown.',
    }),
    totalLayers: t.exposeInt('totalLayers', { nullable: true, description: "The model's layers." }),
    vramUsedBytes: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'GPU memory the replica really holds after loading (free before minus free after).',
      resolve: (r) => r.vramUsedBytes,
    }),
    adapters: t.stringList({
      description:
        "The model's adapters this replica answers for, as its agent last reported them (an adapter published while it runs joins once loaded); an owned one only for those its owner admits.",
      select: { model: { select: { adapters: { select: { name: true, owner: true } } } } },
      resolve: async (r, _args, ctx, info) => {
        if (!r.adapters.length) return [];
        const sight = await sightOf(ctx, info);
        const hidden = new Set(r.model.adapters.filter((a) => !sees(sight, a.owner)).map((a) => a.name));
        return r.adapters.filter((name) => !hidden.has(name));
      },
    }),
    gpuIndex: t.exposeInt('gpuIndex', {
      nullable: true,
      description:
        "The node's GPU it was placed on (as the agent numbers them); null: split across several (gpus), or the node as a whole.",
    }),
    gpus: t.intList({
      description:
        "The node's GPUs it sits on: its one card, the cards a model too large for one is split across (an equal share on each), or every card of a node taken as a whole; empty before it is placed and on a node without a GPU.",
      select: { node: { select: { gpus: true } } },
      resolve: (r) => (r.node ? cardsOf(r, r.node) : []),
    }),
    memoryBytes: t.field({
      type: 'Bytes',
      nullable: true,
      description:
        "What it holds on its GPUs in all, as placement books it: its agent's measurement once loaded with layers on a GPU (memoryMeasured), else its model's planned memory; null when neither is known.",
      select: { model: { select: { memoryBytes: true } } },
      resolve: (r) => {
        const held = heldByReplica(r, r.model.memoryBytes);
        return held.measured || r.model.memoryBytes != null ? Math.round(held.mib * 2 ** 20) : null;
      },
    }),
    memoryMeasured: t.boolean({
      description: 'Whether memoryBytes is what its agent measured after loading (true) or the plan (false).',
      resolve: (r) => heldByReplica(r, null).measured,
    }),
    cards: t.field({
      type: [ReplicaCard],
      description:
        'What it holds on each card it sits on, beside the card\'s size: "GPU 0: 7.9 GiB of 24.0 GiB". Its memoryBytes in equal shares over its cards.',
      select: { node: { select: { gpus: true } }, model: { select: { memoryBytes: true } } },
      resolve: (r) => {
        if (!r.node) return [];
        const indexes = cardsOf(r, r.node);
        const held = heldByReplica(r, r.model.memoryBytes);
        const gpus = nodeGpus(r.node);
        return indexes.map((index) => {
          const g = gpus.find((x) => x.index === index);
          return {
            index,
            name: g?.name ?? 'GPU',
            totalBytes: Math.round((g?.totalMiB ?? 0) * 2 ** 20),
            heldBytes: Math.round((held.mib / indexes.length) * 2 ** 20),
            measured: held.measured,
          };
        });
      },
    }),
    updatedAt: t.expose('updatedAt', { type: 'DateTime' }),
  }),
});

const AssignmentAdapter = builder.objectRef<{ name: string; source: string }>('AssignmentAdapter').implement({
  fields: (t) => ({
    name: t.exposeString('name', { description: 'What requests ask for.' }),
    source: t.exposeString('source', { description: 'The mirror URL of its file (ETag = sha256).' }),
  }),
});

type AssignmentRow = Awaited<ReturnType<Context['services']['fleet']['assignments']>>[number];
const Assignment = builder.objectRef<AssignmentRow>('Assignment').implement({
  description: 'What a node agent should run (or stop).',
  fields: (t) => ({
    replicaId: t.id({ resolve: (a) => a.id }),
    model: t.string({ resolve: (a) => a.model.name }),
    engine: t.string({ description: 'llamacpp or vllm.', resolve: (a) => a.model.engine }),
    source: t.string({
      description: 'The mirror URL of the weights (GGUF: the first shard); its ETag is the sha256.',
      resolve: (a) => a.model.source,
    }),
    contextSize: t.int({ nullable: true, resolve: (a) => a.model.contextSize }),
    parallel: t.int({
      description: 'Requests the replica answers at once (sequences of one context); more wait in its queue.',
      resolve: (a) => a.model.parallel,
    }),
    desired: t.field({ type: ReplicaDesiredEnum, resolve: (a) => a.desired }),
    gpuIndex: t.exposeInt('gpuIndex', {
      nullable: true,
      description:
        'The GPU (its index as the agent reported it) the replica is placed on and must run on alone; null: split across gpuIndexes, or the node as a whole.',
    }),
    gpuIndexes: t.exposeIntList('gpuIndexes', {
      description:
        "The GPUs a model too large for one card is split across, an equal share on each (llama.cpp's tensor split, vLLM's tensor parallelism): the replica runs on these cards together and no others; empty: gpuIndex, or the node as a whole.",
    }),
    gpuMemoryFraction: t.float({
      nullable: true,
      description:
        "The share of each of its cards placement booked for it, for engines that take a budget (vLLM's --gpu-memory-utilization): other replicas may hold the rest. Null on the node as a whole, or when the plan gives no size.",
      resolve: (a) => bookedShare(a, a.node, a.model.memoryBytes),
    }),
    adapters: t.field({
      type: [AssignmentAdapter],
      description:
        "The model's LoRA adapters (llama.cpp: GGUF files in the mirror), loaded when the replica starts and, on the embedded llama.cpp, followed while it runs.",
      resolve: (a) => a.model.adapters,
    }),
  }),
});

builder.queryField('nodeAssignments', (t) =>
  t.field({
    type: [Assignment],
    description: "The replicas this node's agent should run or stop (node token only).",
    authScopes: { node: true },
    resolve: (_root, _args, ctx) =>
      ctx.viewer.kind === 'node' ? ctx.services.fleet.assignments(ctx.viewer.node.id) : [],
  }),
);

const NodeServingWork = builder.objectRef<{ assignments: AssignmentRow[] }>('NodeServingWork').implement({
  fields: (t) => ({ assignments: t.field({ type: [Assignment], resolve: (w) => w.assignments }) }),
});

builder.subscriptionField('nodeServingWork', (t) =>
  t.field({
    type: NodeServingWork,
    description:
      "The calling node's assignments, as nodeAssignments gives them: sent when subscribed, then whenever they change (node token).",
    authScopes: { node: true },
    subscribe: (_root, _args, ctx) => servingWorkOf(ctx),
    resolve: (w: { assignments: AssignmentRow[] }) => w,
  }),
);

const ReplicaReportInput = builder.inputType('ReplicaReportInput', {
  fields: (t) => ({
    replicaId: t.id({ required: true }),
    state: t.field({ type: ReplicaStateEnum, required: true, description: 'LOADING, READY, FAILED or STOPPED.' }),
    message: t.string({ required: false }),
    smokeText: t.string({ required: false }),
    tokensPerSecond: t.float({ required: false }),
    endpoint: t.string({
      required: false,
      description: "With READY: the replica's OpenAI base URL (http://10.0.0.5:8080/v1) the control plane tests.",
    }),
    engineKey: t.string({
      required: false,
      description: 'With READY: the bearer token the endpoint accepts. Kept for the control plane only; never shown.',
    }),
    gpuLayers: t.int({ required: false }),
    totalLayers: t.int({ required: false }),
    vramUsedBytes: t.field({ type: 'Bytes', required: false }),
    adapters: t.stringList({
      required: false,
      description:
        "The adapters the replica answers for now, by name (sent again whenever they change); the gateway sends an adapter's requests only to replicas listing it. Absent leaves what was reported before.",
    }),
  }),
});

builder.mutationField('reportReplica', (t) =>
  t.field({
    type: ReplicaRef,
    description: 'A node agent reports how a replica is doing (node token only).',
    authScopes: { node: true },
    errors: { types: [ValidationError, ConflictError, NotFoundError] },
    args: { input: t.arg({ type: ReplicaReportInput, required: true }) },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.fleet.reportReplica(ctx.actor, { ...args.input, replicaId: String(args.input.replicaId) }),
      ),
  }),
);

builder.queryField('nodes', (t) =>
  t.prismaField({
    type: ['Node'],
    authScopes: { viewer: true },
    resolve: (query, _root, _args, ctx) => ctx.prisma.node.findMany({ ...query, orderBy: { name: 'asc' } }),
  }),
);

const GpuInput = builder.inputType('GpuInput', {
  fields: (t) => ({
    index: t.int({ required: true }),
    name: t.string({ required: true }),
    totalMiB: t.int({ required: true }),
    freeMiB: t.int({ required: true }),
  }),
});
const EngineInput = builder.inputType('EngineInput', {
  fields: (t) => ({
    name: t.string({ required: true, description: '"llama.cpp" or "vllm".' }),
    version: t.string({ required: false }),
    build: t.int({ required: false, description: "llama.cpp's build number." }),
  }),
});
const NodeReportInput = builder.inputType('NodeReportInput', {
  fields: (t) => ({
    gpus: t.field({ type: [GpuInput], required: true }),
    engines: t.field({ type: [EngineInput], required: true }),
    diskFreeBytes: t.field({ type: 'Bytes', required: false }),
    agentVersion: t.string({ required: false }),
  }),
});

builder.mutationField('reportNode', (t) =>
  t.field({
    type: NodeRef,
    description: "A node agent's heartbeat with its inventory (node token only).",
    authScopes: { node: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { input: t.arg({ type: NodeReportInput, required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.report(ctx.actor, args.input)),
  }),
);

builder.mutationField('createNode', (t) =>
  t.field({
    type: CreatedNode,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.createNode(ctx.actor, args)),
  }),
);

const RemovedNode = builder.objectRef<{ name: string; message: string }>('RemovedNode').implement({
  fields: (t) => ({
    name: t.exposeString('name'),
    message: t.exposeString('message', { description: 'What became of its replicas and training jobs.' }),
  }),
});

builder.mutationField('removeNode', (t) =>
  t.field({
    type: RemovedNode,
    description:
      'Removes a node. Refused while it runs replicas or a training job, naming them (stopping its agent drains its replicas first); with force its replicas are placed on other nodes at once, cutting the requests in flight there, and its jobs failed, saying so.',
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError, NotFoundError] },
    args: { name: t.arg.string({ required: true }), force: t.arg.boolean({ required: false }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.removeNode(ctx.actor, args)),
  }),
);

builder.mutationField('rotateNodeToken', (t) =>
  t.field({
    type: CreatedNode,
    description:
      'A new token for the node, shown once; the old one is refused from now. Start its agent with the new one.',
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.rotateNodeToken(ctx.actor, args)),
  }),
);

builder.mutationField('revokeNodeToken', (t) =>
  t.field({
    type: NodeRef,
    description:
      "Refuses the node's token from now, with no new one: the node goes offline and its replicas are placed elsewhere.",
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.revokeNodeToken(ctx.actor, args)),
  }),
);

builder.mutationField('leaveNode', (t) =>
  t.field({
    type: NodeRef,
    description:
      'A node agent says it is stopping (node token only): the node is offline at once and its replicas are placed elsewhere.',
    authScopes: { node: true },
    errors: { types: [ConflictError] },
    resolve: async (_root, _args, ctx) => unwrap(await ctx.services.fleet.leave(ctx.actor)),
  }),
);
