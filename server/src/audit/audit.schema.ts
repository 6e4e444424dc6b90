import type { AuditEvent } from '../generated/prisma/client.js';
import { AuditOutcome } from '../generated/prisma/enums.js';
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

builder.queryField('auditEvents', (t) =>
  t.field({
    type: AuditEventConnection,
    description: 'Newest first. `after` is the endCursor of the previous page.',
    authScopes: { viewer: true },
    args: {
      first: t.arg.int({ required: false, defaultValue: 50, description: '1 to 200.' }),
      after: t.arg.string({ required: false }),
    },
    resolve: (_root, args, ctx) => {
      const first = Math.min(Math.max(args.first ?? 50, 1), 200);
      const after = args.after && /^\d+$/.test(args.after) ? BigInt(args.after) : undefined;
      return ctx.services.audit.page(first, after);
    },
  }),
);

builder.subscriptionField('auditEventAdded', (t) =>
  t.field({
    type: AuditEventRef,
    description: 'Each audit event as it is committed.',
    authScopes: { viewer: true },
    subscribe: (_root, _args, ctx) => ctx.pubsub.subscribe('auditEvent'),
    resolve: (id: string, _args, ctx) => ctx.prisma.auditEvent.findUniqueOrThrow({ where: { id: BigInt(id) } }),
  }),
);
