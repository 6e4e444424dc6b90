import { filter, pipe } from 'graphql-yoga';
import type { Context } from '../context.js';
import type { AuditEvent } from '../generated/prisma/client.js';
import { AuditOutcome } from '../generated/prisma/enums.js';
import { unwrap } from '../lib/errors.js';
import { ownerName } from '../org/org.schema.js';
import { seenOwners } from '../org/org-owners.js';
import { sees, sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';

const AuditOutcomeEnum = builder.enumType(AuditOutcome, { name: 'AuditOutcome' });

const AuditEventRef = builder.prismaObject('AuditEvent', {
  description: 'One mutation, done or refused: who, what, on what, and how it ended.',
  fields: (t) => ({
    id: t.id({ resolve: (e) => e.id.toString() }),
    at: t.expose('at', { type: 'DateTime' }),
    actor: t.exposeString('actor'),
    action: t.exposeString('action'),
    target: t.exposeString('target', { nullable: true }),
    outcome: t.expose('outcome', { type: AuditOutcomeEnum }),
    message: t.exposeString('message', { nullable: true }),
    requestId: t.exposeString('requestId', { nullable: true }),
    ownerName: t.string({
      nullable: true,
      description: 'The owner of the thing the row is about, as people read it: "team:acme/support".',
      resolve: (e, _args, ctx) => ownerName(ctx, e.owner),
    }),
  }),
});

export const PageInfo = builder.objectRef<{ hasNextPage: boolean; endCursor: string | null }>('PageInfo').implement({
  fields: (t) => ({
    hasNextPage: t.exposeBoolean('hasNextPage'),
    endCursor: t.exposeString('endCursor', { nullable: true }),
  }),
});

const AuditEventEdge = builder.objectRef<AuditEvent>('AuditEventEdge').implement({
  fields: (t) => ({
    cursor: t.string({ resolve: (e) => e.id.toString() }),
    node: t.field({ type: AuditEventRef, resolve: (e) => e }),
  }),
});

const AuditEventConnection = builder
  .objectRef<{ rows: AuditEvent[]; hasNextPage: boolean }>('AuditEventConnection')
  .implement({
    fields: (t) => ({
      edges: t.field({ type: [AuditEventEdge], resolve: (c) => c.rows }),
      pageInfo: t.field({
        type: PageInfo,
        resolve: (c) => ({ hasNextPage: c.hasNextPage, endCursor: c.rows.at(-1)?.id.toString() ?? null }),
      }),
    }),
  });

const AuditFilter = builder.inputType('AuditFilter', {
  description: 'Every field given must hold; text matches anywhere in the value, in any case.',
  fields: (t) => ({
    actor: t.string({ required: false, description: 'Part of the actor: "user:ops@", "node:gpu-1", "token:".' }),
    action: t.string({ required: false, description: 'Part of the action: "login", "Token".' }),
    target: t.string({ required: false }),
    outcome: t.field({ type: AuditOutcomeEnum, required: false }),
    from: t.field({ type: 'DateTime', required: false, description: 'At or after this time.' }),
    to: t.field({ type: 'DateTime', required: false, description: 'Before this time.' }),
  }),
});

builder.queryField('auditEvents', (t) =>
  t.field({
    type: AuditEventConnection,
    description: 'Newest first. `after` is the endCursor of the previous page, asked with the same filter.',
    authScopes: { viewer: true },
    args: {
      first: t.arg.int({ required: false, defaultValue: 50, description: '1 to 200.' }),
      after: t.arg.string({ required: false }),
      filter: t.arg({ type: AuditFilter, required: false }),
    },
    // Rows about an owned thing only for those its owner admits, and admins (the row names it, as its list would).
    resolve: async (_root, args, ctx, info) => {
      const first = Math.min(Math.max(args.first ?? 50, 1), 200);
      const after = args.after && /^\d+$/.test(args.after) ? BigInt(args.after) : undefined;
      const owners = seenOwners(await sightOf(ctx, info));
      return unwrap(await ctx.services.audit.page(first, after, args.filter ?? undefined, owners));
    },
  }),
);

/** One read for every subscriber (pubsub.ts: shared); an audit event is the same whoever may see it. */
function auditRow(ctx: Context, id: string) {
  return ctx.pubsub.shared('auditEvent', id, 'row', () =>
    ctx.prisma.auditEvent.findUniqueOrThrow({ where: { id: BigInt(id) } }),
  );
}

builder.subscriptionField('auditEventAdded', (t) =>
  t.field({
    type: AuditEventRef,
    description: 'Each audit event as it is committed.',
    authScopes: { viewer: true },
    // A row about an owned thing is sent only to those its owner admits, and admins.
    subscribe: (_root, _args, ctx) =>
      pipe(
        ctx.pubsub.subscribe('auditEvent'),
        filter(async (id: string) => sees(await sightOf(ctx), (await auditRow(ctx, id)).owner)),
      ),
    resolve: (id: string, _args, ctx) => auditRow(ctx, id),
  }),
);
