import type { Node } from '../generated/prisma/client.js';
import { ConflictError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';

type GpuReport = { index: number; name: string; totalMiB: number; freeMiB: number };
type EngineReport = { name: string; version: string | null; build: number | null };

const Gpu = builder.objectRef<GpuReport>('Gpu').implement({
  fields: (t) => ({
    index: t.exposeInt('index'),
    name: t.exposeString('name'),
    totalMiB: t.exposeInt('totalMiB'),
    freeMiB: t.exposeInt('freeMiB'),
  }),
});

const EngineInfo = builder.objectRef<EngineReport>('EngineInfo').implement({
  fields: (t) => ({
    name: t.exposeString('name'),
    version: t.exposeString('version', { nullable: true }),
    build: t.exposeInt('build', {
      nullable: true,
      description: "llama.cpp's build number, which decides what it loads.",
    }),
  }),
});

export const NodeRef = builder.prismaObject('Node', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    online: t.boolean({ resolve: (n, _args, ctx) => ctx.services.fleet.isOnline(n) }),
    lastSeenAt: t.expose('lastSeenAt', { type: 'DateTime', nullable: true }),
    gpus: t.field({ type: [Gpu], resolve: (n) => (Array.isArray(n.gpus) ? (n.gpus as GpuReport[]) : []) }),
    engines: t.field({
      type: [EngineInfo],
      resolve: (n) => (Array.isArray(n.engines) ? (n.engines as EngineReport[]) : []),
    }),
    diskFreeBytes: t.field({ type: 'Bytes', nullable: true, resolve: (n) => n.diskFreeBytes }),
    agentVersion: t.exposeString('agentVersion', { nullable: true }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
  }),
});

const CreatedNode = builder.objectRef<{ node: Node; token: string }>('CreatedNode').implement({
  fields: (t) => ({
    node: t.field({ type: NodeRef, resolve: (p) => p.node }),
    token: t.exposeString('token', {
      description: "The agent's node token (HANGAR_NODE_TOKEN). Shown this once: Hangar keeps only its hash.",
    }),
  }),
});

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
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.report(ctx, args.input)),
  }),
);

builder.mutationField('createNode', (t) =>
  t.field({
    type: CreatedNode,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.fleet.createNode(ctx, args)),
  }),
);
