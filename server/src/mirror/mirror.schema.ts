import { filter, pipe } from 'graphql-yoga';
import type { Context } from '../context.js';
import {
  ConflictError,
  fail,
  NotFoundError,
  type Result,
  UnloadableError,
  unwrap,
  ValidationError,
} from '../lib/errors.js';
import type { Sight } from '../org/org.service.js';
import { sees, sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import { asksFor } from '../schema/selection.js';
import { type MirrorVersionView, sourceKey, versionKey } from './mirror.service.js';
import {
  FetchStartedRef,
  loadUsesFirst,
  Mirror,
  MirrorBandwidth,
  MirrorSourceInput,
  MirrorVersionRef,
  RemovedMirrorVersion,
} from './mirror.types.js';
import { versionOwner, versionOwners } from './owned.js';

// Types live in mirror.types.ts; re-exported so importers keep importing them from here.
export { bytesOnDisk, FetchStartedRef, MirrorVersionRef, ModelMode } from './mirror.types.js';

builder.queryFields((t) => ({
  mirror: t.field({
    type: Mirror,
    authScopes: { viewer: true },
    // The versions the caller may see: an owned adapter's only for those its owner admits (as GET /mirror/…), left
    // out before anything is counted or summed, so the counts and the bytes used do not tell of it either.
    resolve: async (_root, _args, ctx, info) => {
      const [versions, freeBytes, owners, sight] = await Promise.all([
        ctx.services.mirror.versions(),
        ctx.services.mirror.freeBytes(),
        sightOf(ctx, info).then((s) => (s.admin ? undefined : versionOwners(ctx.prisma))),
        sightOf(ctx, info),
        asksFor(info, 'usedBy') ? loadUsesFirst(ctx) : undefined,
      ]);
      if (!owners) return { versions, freeBytes };
      const seen = (v: MirrorVersionView) =>
        (owners.get(sourceKey(v.model, v.version)) ?? []).every((o) => sees(sight, o));
      return { versions: versions.filter(seen), freeBytes };
    },
  }),
  mirrorVersion: t.field({
    type: MirrorVersionRef,
    nullable: true,
    description:
      'Null for a version the caller may not see (an owned adapter its owner does not admit it to), as for none.',
    authScopes: { viewer: true },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx, info) =>
      (await seesVersion(ctx, args.model, args.version, await sightOf(ctx, info)))
        ? ctx.services.mirror.version(args.model, args.version)
        : null,
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
    resolve: async (_root, args, ctx, info) =>
      unwrap((await unseen(ctx, info, args)) ?? (await ctx.services.mirror.cancel(ctx.actor, args))),
  }),
  retryMirrorFetch: t.field({
    type: MirrorVersionRef,
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx, info) =>
      unwrap((await unseen(ctx, info, args)) ?? (await ctx.services.mirror.retry(ctx.actor, args))),
  }),
  pauseMirrorFetch: t.field({
    type: MirrorVersionRef,
    description: 'Stops the downloads of a version and keeps what arrived; resumeMirrorFetch goes on from there.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx, info) =>
      unwrap((await unseen(ctx, info, args)) ?? (await ctx.services.mirror.pause(ctx.actor, args))),
  }),
  resumeMirrorFetch: t.field({
    type: MirrorVersionRef,
    description: "Queues a paused version's files again, each continuing from its partial with a Range request.",
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { model: t.arg.string({ required: true }), version: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx, info) =>
      unwrap((await unseen(ctx, info, args)) ?? (await ctx.services.mirror.resume(ctx.actor, args))),
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
    resolve: async (_root, args, ctx, info) =>
      unwrap(
        (await unseen(ctx, info, args)) ??
          (await ctx.services.mirror.remove(ctx.actor, args, await sightOf(ctx, info))),
      ),
  }),
}));

/**
 * Whether the caller may see a version: not an owned adapter's whose owner does not admit it (owned.ts, the rule
 * GET /mirror/… keeps). `event`: the subscribers of that event share one read of the owner (pubsub.ts: shared).
 */
async function seesVersion(ctx: Context, model: string, version: string, sight: Sight, event?: string) {
  if (sight.admin) return true;
  const read = () => versionOwner(ctx.prisma, model, version);
  const owned = await (event ? ctx.pubsub.shared('mirrorVersion', event, 'owner', read) : read());
  return !owned || sees(sight, owned.owner);
}

/**
 * A version the caller may not see is changed by nobody it is hidden from: cancel, retry, pause, resume and remove
 * answer the mirror's own words for a version that does not exist, and change nothing.
 */
async function unseen(
  ctx: Context,
  info: Parameters<typeof sightOf>[1],
  args: { model: string; version: string },
): Promise<Result<never> | null> {
  if (await seesVersion(ctx, args.model, args.version, await sightOf(ctx, info))) return null;
  return fail(new NotFoundError(`the mirror has no ${args.model}/${args.version}`));
}

// Events are published as each file's progress is persisted (about once a second per transfer) and on every
// state change, so a version sends a few events a second at most; each carries the whole version.
builder.subscriptionFields((t) => ({
  mirrorChanged: t.field({
    type: MirrorVersionRef,
    description: 'Every version that changes, whole.',
    authScopes: { viewer: true },
    subscribe: (_root, _args, ctx) =>
      pipe(
        ctx.pubsub.subscribe('mirrorVersion'),
        filter(async (key: string) => {
          const [model = '', version = ''] = key.split('/');
          return seesVersion(ctx, model, version, await sightOf(ctx), key);
        }),
      ),
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
        filter(
          async (key: string) =>
            key === versionKey(args.model, args.version) &&
            seesVersion(ctx, args.model, args.version, await sightOf(ctx), key),
        ),
      ),
    resolve: (key: string, args, ctx) =>
      ctx.pubsub.shared('mirrorVersion', key, 'version', () =>
        ctx.services.mirror.versionOrRemoved(args.model, args.version),
      ),
  }),
}));
