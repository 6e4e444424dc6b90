import type { ModelFacts } from '@hangar/common/gguf/facts';
import type { MemoryEstimate } from '@hangar/common/gguf/memory';
import type { Verdict } from '@hangar/common/gguf/verdict';
import {
  ConflictError,
  NotFoundError,
  RegistryOffError,
  UpstreamError,
  unwrap,
  ValidationError,
} from '../lib/errors.js';
import { FetchStartedRef } from '../mirror/mirror.schema.js';
import { builder } from '../schema/builder.js';
import type { HubModel } from './hub.js';
import type { JudgedSet, NodeFit, RegistryRepo } from './registry.service.js';
import type { RepoFile } from './sets.js';

const RegistryModel = builder.objectRef<HubModel>('RegistryModel').implement({
  description: 'A repository as the registry lists it.',
  fields: (t) => ({
    id: t.exposeID('id'),
    downloads: t.exposeInt('downloads'),
    likes: t.exposeInt('likes'),
    lastModified: t.field({ type: 'DateTime', nullable: true, resolve: (m) => m.lastModified }),
    gated: t.exposeBoolean('gated'),
    hasGguf: t.exposeBoolean('hasGguf'),
  }),
});

const RegistrySearch = builder
  .objectRef<{ models: HubModel[]; hasNextPage: boolean; endCursor: string | null }>('RegistrySearch')
  .implement({
    fields: (t) => ({
      nodes: t.field({ type: [RegistryModel], resolve: (s) => s.models }),
      hasNextPage: t.exposeBoolean('hasNextPage'),
      endCursor: t.exposeString('endCursor', { nullable: true }),
    }),
  });

const RepoFileRef = builder.objectRef<RepoFile>('RegistryFile').implement({
  fields: (t) => ({
    path: t.exposeString('path'),
    size: t.field({ type: 'Bytes', resolve: (f) => f.size }),
    sha256: t.exposeString('sha256', { nullable: true, description: "The registry's LFS oid: the file's sha256." }),
  }),
});

const Header = builder.objectRef<ModelFacts>('GgufHeader').implement({
  description: "What the set's GGUF header says (the first shard's, which carries the metadata).",
  fields: (t) => ({
    architecture: t.exposeString('architecture', { nullable: true }),
    name: t.exposeString('name', { nullable: true }),
    contextLength: t.exposeInt('contextLength', { nullable: true }),
    layers: t.exposeInt('layers', { nullable: true }),
    embeddingLength: t.exposeInt('embeddingLength', { nullable: true }),
    heads: t.exposeInt('heads', { nullable: true }),
    kvHeads: t.exposeInt('kvHeads', { nullable: true }),
    keyLength: t.exposeInt('keyLength', { nullable: true }),
    valueLength: t.exposeInt('valueLength', { nullable: true }),
    fileType: t.exposeString('fileType', { nullable: true }),
    parameterCount: t.field({
      type: 'Bytes',
      description: 'A count, in the same exact-to-2^53 scalar.',
      resolve: (f) => f.parameterCount,
    }),
    tensorBytes: t.field({ type: 'Bytes', resolve: (f) => f.tensorBytes }),
  }),
});

const VerdictRef = builder.objectRef<Verdict>('Verdict').implement({
  fields: (t) => ({
    servable: t.exposeBoolean('servable'),
    reason: t.exposeString('reason'),
    neededBuild: t.exposeInt('neededBuild', {
      nullable: true,
      description: 'The llama.cpp build that first loads it.',
    }),
  }),
});

const Memory = builder.objectRef<MemoryEstimate>('MemoryEstimate').implement({
  fields: (t) => ({
    context: t.exposeInt('context'),
    weightsBytes: t.field({ type: 'Bytes', resolve: (m) => m.weightsBytes }),
    kvCacheBytes: t.field({ type: 'Bytes', resolve: (m) => m.kvCacheBytes }),
    overheadBytes: t.field({ type: 'Bytes', resolve: (m) => m.overheadBytes }),
    totalBytes: t.field({ type: 'Bytes', resolve: (m) => m.totalBytes }),
    basis: t.exposeString('basis'),
  }),
});

const NodeFitRef = builder.objectRef<NodeFit>('NodeFit').implement({
  fields: (t) => ({
    node: t.exposeString('node'),
    fits: t.exposeBoolean('fits'),
    freeMiB: t.exposeInt('freeMiB'),
    neededMiB: t.exposeInt('neededMiB'),
    reason: t.exposeString('reason'),
  }),
});

const DiskFit = builder.objectRef<JudgedSet['fits']['disk']>('DiskFit').implement({
  fields: (t) => ({
    fits: t.exposeBoolean('fits'),
    freeBytes: t.field({ type: 'Bytes', resolve: (d) => d.freeBytes }),
    neededBytes: t.field({ type: 'Bytes', resolve: (d) => d.neededBytes }),
  }),
});

const Fits = builder.objectRef<JudgedSet['fits']>('Fits').implement({
  fields: (t) => ({
    disk: t.field({ type: DiskFit, description: "Whether the mirror's disk holds the set.", resolve: (f) => f.disk }),
    nodes: t.field({
      type: [NodeFitRef],
      description: 'Each online node: whether its free GPU memory holds the estimate.',
      resolve: (f) => f.nodes,
    }),
    summary: t.exposeString('summary'),
  }),
});

const SetKindEnum = builder.enumType('FileSetKind', {
  description:
    "What the set's GGUF header says it is (general.type, or a clip architecture); a name's guess only when the header could not be read.",
  values: ['MODEL', 'ADAPTER', 'MMPROJ', 'IMATRIX'] as const,
});
const SetFormatEnum = builder.enumType('FileSetFormat', { values: ['GGUF', 'SAFETENSORS'] as const });

const FileSetRef = builder.objectRef<JudgedSet>('FileSet').implement({
  description: 'What can be fetched as one: a file, or every shard of one.',
  fields: (t) => ({
    id: t.exposeID('id'),
    kind: t.field({ type: SetKindEnum, resolve: (s) => s.kind }),
    format: t.field({ type: SetFormatEnum, resolve: (s) => s.format }),
    quant: t.exposeString('quant', { nullable: true }),
    files: t.field({ type: [RepoFileRef], resolve: (s) => s.files }),
    shardCount: t.exposeInt('shardCount'),
    complete: t.exposeBoolean('complete'),
    totalBytes: t.field({ type: 'Bytes', resolve: (s) => s.totalBytes }),
    model: t.exposeString('model', { description: 'The suggested catalog model name; the operator may change it.' }),
    version: t.exposeString('version', {
      description:
        'The suggested version, one per set: the short revision and what the set is (3f2a1b7-q4_k_m, 3f2a1b7-mmproj-f16).',
    }),
    header: t.field({ type: Header, nullable: true, resolve: (s) => s.facts }),
    headerError: t.exposeString('headerError', { nullable: true }),
    headerBytesRead: t.field({
      type: 'Bytes',
      description: 'What judging it cost: bytes read of the header.',
      resolve: (s) => s.headerBytesRead,
    }),
    verdict: t.field({ type: VerdictRef, resolve: (s) => s.verdict }),
    memory: t.field({ type: Memory, nullable: true, resolve: (s) => s.memory }),
    fits: t.field({ type: Fits, resolve: (s) => s.fits }),
  }),
});

const RegistryRepoRef = builder.objectRef<RegistryRepo>('RegistryRepo').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    revision: t.exposeString('revision'),
    shortRevision: t.exposeString('shortRevision'),
    gated: t.exposeBoolean('gated'),
    noAccess: t.exposeString('noAccess', {
      nullable: true,
      description: 'Why the files cannot be fetched (gated without access).',
    }),
    architecture: t.exposeString('architecture', {
      nullable: true,
      description: 'The architecture the registry reports.',
    }),
    url: t.exposeString('url'),
    cardHtml: t.exposeString('cardHtml', { nullable: true, description: 'The model card, rendered and sanitized.' }),
    sets: t.field({ type: [FileSetRef], resolve: (r) => r.sets }),
  }),
});

const RegistrySort = builder.enumType('RegistrySort', { values: ['downloads', 'likes', 'lastModified'] as const });

const RegistrySettings = builder.objectRef<{ enabled: boolean; siteUrl: string | null }>('RegistrySettings').implement({
  description: "Whether this server's registry explorer is on (HANGAR_HUB_URL), for the console to show it or not.",
  fields: (t) => ({
    enabled: t.exposeBoolean('enabled', {
      description: 'False when HANGAR_HUB_URL=off: the registry queries then answer RegistryOffError.',
    }),
    siteUrl: t.exposeString('siteUrl', { nullable: true, description: 'The registry it browses; null when off.' }),
  }),
});

builder.queryFields((t) => ({
  registrySettings: t.field({
    type: RegistrySettings,
    authScopes: { viewer: true },
    resolve: (_root, _args, ctx) => ctx.services.registry.settings,
  }),
  registrySearch: t.field({
    type: RegistrySearch,
    authScopes: { viewer: true },
    errors: { types: [RegistryOffError, UpstreamError, ValidationError] },
    args: {
      query: t.arg.string({ required: false }),
      sort: t.arg({ type: RegistrySort, required: false }),
      first: t.arg.int({ required: false }),
      after: t.arg.string({ required: false }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.registry.search(args)),
  }),
  registryRepo: t.field({
    type: RegistryRepoRef,
    authScopes: { viewer: true },
    errors: { types: [RegistryOffError, UpstreamError, ValidationError, NotFoundError] },
    args: {
      id: t.arg.string({ required: true }),
      revision: t.arg.string({ required: false }),
      context: t.arg.int({
        required: false,
        description: "The context the memory estimate uses; default the model's, capped by HANGAR_MAX_CONTEXT.",
      }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.registry.repo(args)),
  }),
}));

builder.mutationField('fetchRepoSet', (t) =>
  t.field({
    type: FetchStartedRef,
    authScopes: { operator: true },
    errors: { types: [RegistryOffError, ValidationError, ConflictError, NotFoundError, UpstreamError] },
    args: {
      repo: t.arg.string({ required: true }),
      revision: t.arg.string({ required: false }),
      set: t.arg.string({ required: true }),
      model: t.arg.string({ required: false }),
      version: t.arg.string({ required: false }),
      force: t.arg.boolean({ required: false, description: 'Fetch a set the verdict says cannot be served.' }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.registry.fetchSet(ctx.actor, args)),
  }),
);
