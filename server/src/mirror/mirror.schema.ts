import { filter, pipe } from 'graphql-yoga';
import { ConflictError, NotFoundError, UnloadableError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { asksFor } from '../schema/selection.js';
import { versionKey } from './mirror.service.js';
import {
  FetchStartedRef,
  loadUsesFirst,
  Mirror,
  MirrorBandwidth,
  MirrorSourceInput,
  MirrorVersionRef,
  RemovedMirrorVersion,
} from './mirror.types.js';

// Types live in mirror.types.ts; re-exported so importers keep importing them from here.
export { bytesOnDisk, FetchStartedRef, MirrorVersionRef, ModelMode } from './mirror.types.js';

builder.queryFields((t) => ({
  mirror: t.field({
    type: Mirror,
    authScopes: { viewer: true },
    resolve: async (_root, _args, ctx, info) => {
      const [versions, freeBytes] = await Promise.all([
        ctx.services.mirror.versions(),
        ctx.services.mirror.freeBytes(),
        asksFor(info, 'usedBy') ? loadUsesFirst(ctx) : undefined,
      ]);
      return { versions, freeBytes };
    },
  }),
  mirrorVersion: t.field({
    type: MirrorVersionRef,
    nullable: true,
    authScopes: { viewer: true },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: (_root, args, ctx) => ctx.services.mirror.version(args.model, args.version),
  }),
}));

builder.mutationFields((t) => ({
  fetchToMirror: t.field({
    type: FetchStartedRef,
    authScopes: { operator: true },
    errors: { types: [ValidationError, ConflictError, UnloadableError] },
    args: {
      model: t.arg.string({ required: true }),
      version: t.arg.string({ required: true }),
      sources: t.arg({ type: [MirrorSourceInput], required: true }),
      force: t.arg.boolean({ required: false, description: 'Fetch files again even when present.' }),
      fetchAnyway: t.arg.boolean({
        required: false,
        description:
          "Fetch without reading the GGUF headers first: for a file the check refused (UnloadableError), an architecture the nodes' llama.cpp does not know yet, say.",
      }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.fetch(ctx.actor, args)),
  }),
  cancelMirrorFetch: t.field({
    type: MirrorVersionRef,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.cancel(ctx.actor, args)),
  }),
  retryMirrorFetch: t.field({
    type: MirrorVersionRef,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.retry(ctx.actor, args)),
  }),
  pauseMirrorFetch: t.field({
    type: MirrorVersionRef,
    description: 'Stops the downloads of a version and keeps what arrived; resumeMirrorFetch goes on from there.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.pause(ctx.actor, args)),
  }),
  resumeMirrorFetch: t.field({
    type: MirrorVersionRef,
    description: "Queues a paused version's files again, each continuing from its partial with a Range request.",
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.resume(ctx.actor, args)),
  }),
  setMirrorBandwidth: t.field({
    type: MirrorBandwidth,
    description:
      'Limits what all downloads of this server process share, at once, until it restarts (HANGAR_MIRROR_BANDWIDTH is the lasting setting). Null or 0: no limit.',
    authScopes: { operator: true },
    errors: { types: [ValidationError] },
    args: { bytesPerSecond: t.arg({ type: 'Bytes', required: false }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.setBandwidth(ctx.actor, args)),
  }),
  removeMirrorVersion: t.field({
    type: RemovedMirrorVersion,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      model: t.arg.string({ required: true }),
      version: t.arg.string({ required: true }),
      force: t.arg.boolean({ required: false, description: 'Remove it even while catalog models use it.' }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.mirror.remove(ctx.actor, args)),
  }),
}));

// Events are published as each file's progress is persisted (about once a second per transfer) and on every
// state change, so a version sends a few events a second at most; each carries the whole version.
builder.subscriptionFields((t) => ({
  mirrorChanged: t.field({
    type: MirrorVersionRef,
    description: 'Every version that changes, whole.',
    authScopes: { viewer: true },
    subscribe: (_root, _args, ctx) => ctx.pubsub.subscribe('mirrorVersion'),
    resolve: (key: string, _args, ctx) => {
      const [model = '', version = ''] = key.split('/');
      return ctx.pubsub.shared('mirrorVersion', key, 'version', () =>
        ctx.services.mirror.versionOrRemoved(model, version),
      );
    },
  }),
  mirrorVersionChanged: t.field({
    type: MirrorVersionRef,
    authScopes: { viewer: true },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    subscribe: (_root, args, ctx) =>
      pipe(
        ctx.pubsub.subscribe('mirrorVersion'),
        filter((key: string) => key === versionKey(args.model, args.version)),
      ),
    resolve: (key: string, args, ctx) =>
      ctx.pubsub.shared('mirrorVersion', key, 'version', () =>
        ctx.services.mirror.versionOrRemoved(args.model, args.version),
      ),
  }),
}));
