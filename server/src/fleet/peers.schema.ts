import { ConflictError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import type { PeerPlan, PeerSource } from './peers.service.js';

// Weights node to node (peers.service.ts): what node agents report of their model files, and where one asks
// where to fetch a file from. Node token only.

const NodeFileInput = builder.inputType('NodeFileInput', {
  fields: (t) => ({
    sha256: t.string({ required: true }),
    bytes: t.field({ type: 'Bytes', required: true }),
  }),
});

const NodeFilesInput = builder.inputType('NodeFilesInput', {
  fields: (t) => ({
    url: t.string({
      required: false,
      description: "Where other nodes fetch this node's files (http://host:port); null: it serves none.",
    }),
    held: t.field({ type: [NodeFileInput], required: true, description: 'Verified, whole files it holds.' }),
    fetching: t.field({ type: [NodeFileInput], required: true, description: 'Files it is fetching now.' }),
    mirrorBytes: t.field({
      type: 'Bytes',
      required: true,
      description: 'Bytes downloaded from the mirror since the agent started.',
    }),
    peerBytes: t.field({
      type: 'Bytes',
      required: true,
      description: 'Bytes downloaded from other nodes since the agent started.',
    }),
  }),
});

const NodeFilesReport = builder.objectRef<{ nodeId: string; peerKey: string }>('NodeFilesReport').implement({
  fields: (t) => ({
    nodeId: t.exposeID('nodeId'),
    peerKey: t.exposeString('peerKey', {
      description:
        "The key this node's agent checks other nodes' tickets with (HMAC-SHA256). Given to this node alone.",
    }),
  }),
});

const PeerSourceRef = builder.objectRef<PeerSource>('PeerSource').implement({
  fields: (t) => ({
    nodeId: t.exposeID('nodeId'),
    node: t.exposeString('node', { description: "The node's name." }),
    url: t.exposeString('url', {
      description: 'The file on that node: GET with Range, the ticket as the bearer token.',
    }),
    ticket: t.exposeString('ticket', {
      description: 'Lets the asking node fetch this file from that node for a minute (requests begun within it).',
    }),
    held: t.exposeBoolean('held', {
      description: 'Whole and verified there; false: still arriving there, served as it arrives.',
    }),
  }),
});

const PeerSources = builder.objectRef<PeerPlan>('PeerSources').implement({
  fields: (t) => ({
    you: t.exposeID('you', { description: "The asking node's id, as tickets name it." }),
    fromMirror: t.exposeBoolean('fromMirror', {
      description: 'No other node has it: the asker fetches it from the mirror, and others will fetch from the asker.',
    }),
    sources: t.field({ type: [PeerSourceRef], resolve: (p) => p.sources }),
  }),
});

builder.mutationField('reportNodeFiles', (t) =>
  t.field({
    type: NodeFilesReport,
    description:
      "A node agent's model files, held and being fetched, by sha256 (replacing what it said before), its file URL and bytes downloaded by source (node token only).",
    authScopes: { node: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { input: t.arg({ type: NodeFilesInput, required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.peers.report(ctx.actor, args.input)),
  }),
);

builder.mutationField('peerSources', (t) =>
  t.field({
    type: PeerSources,
    description:
      'Where the calling node should fetch a file from: nodes holding or fetching it, each with a ticket, or the mirror when none (node token only).',
    authScopes: { node: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      sha256: t.arg.string({ required: true }),
      bytes: t.arg({ type: 'Bytes', required: true }),
      exclude: t.arg.idList({ required: false, description: 'Nodes the asker could not fetch it from.' }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.peers.sources(ctx.actor, {
          sha256: args.sha256,
          bytes: args.bytes,
          exclude: args.exclude?.map(String) ?? null,
        }),
      ),
  }),
);
