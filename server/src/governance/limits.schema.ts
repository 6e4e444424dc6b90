import { ApiTokenRef } from '../access/access.schema.js';
import { ForbiddenError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import type { LimitUsage, LimitView } from './limits.service.js';
import type { LimitKind } from './limits-windows.js';

// Limits and budgets (DESIGN.md §8, "Governance"): setLimit, removeLimit, limits(scope). The names are for
// scripts; keep them.

const LimitKindEnum = builder.enumType('LimitKind', {
  values: {
    requestsPerMinute: { description: 'Requests started per minute.' },
    tokensPerMinute: { description: 'Prompt and completion tokens per minute.' },
    concurrentRequests: { description: 'Requests in flight at once.' },
    tokensPerDay: { description: 'Prompt and completion tokens per UTC day.' },
    tokensPerMonth: { description: 'Prompt and completion tokens per UTC month.' },
    spendPerMonth: { description: "Money per UTC month, in the site's currency, at the cost of each call." },
  } as const,
});

const LimitUsageRef = builder.objectRef<LimitUsage>('LimitUsage').implement({
  description: 'One kind of a limit in its current window, as the server answering sees it (its own share fresh).',
  fields: (t) => ({
    kind: t.field({ type: LimitKindEnum, resolve: (u) => u.kind }),
    limit: t.float({ resolve: (u) => u.limit }),
    used: t.float({ resolve: (u) => u.used }),
    remaining: t.float({ resolve: (u) => u.remaining }),
    resetAt: t.field({
      type: 'DateTime',
      nullable: true,
      description: 'Null: requests at once never reset.',
      resolve: (u) => (u.resetAt.getTime() > 0 && Number.isFinite(u.resetAt.getTime()) ? u.resetAt : null),
    }),
  }),
});

const LimitRefuserRef = builder
  .objectRef<{ caller: string; count: number; kinds: LimitKind[]; since: Date }>('LimitRefuser')
  .implement({
    description: 'A caller a limit refused, and how often, in the last minute window.',
    fields: (t) => ({
      caller: t.string({
        description: 'As a scope is written: "key:nightly (ana@example.com)", or "user:<email>" for a console session.',
        resolve: (r) => r.caller,
      }),
      count: t.int({ resolve: (r) => r.count }),
      kinds: t.field({ type: [LimitKindEnum], description: 'The kinds that refused it.', resolve: (r) => r.kinds }),
      since: t.field({ type: 'DateTime', description: 'The start of the window counted.', resolve: (r) => r.since }),
    }),
  });

const LimitRef = builder.objectRef<LimitView>('Limit').implement({
  description: 'Limits on a scope, for every model or for one: the tightest of all that apply to a request decides.',
  fields: (t) => ({
    id: t.exposeID('id'),
    scope: t.string({ description: 'As people write it: "team:acme/research".', resolve: (l) => l.scopeLabel }),
    scopeKey: t.string({ description: 'As it is stored: "team:<id>".', resolve: (l) => l.scope }),
    model: t.string({ nullable: true, description: 'Null: every model.', resolve: (l) => l.model || null }),
    requestsPerMinute: t.int({ nullable: true, resolve: (l) => l.requestsPerMinute }),
    tokensPerMinute: t.int({ nullable: true, resolve: (l) => l.tokensPerMinute }),
    concurrentRequests: t.int({ nullable: true, resolve: (l) => l.concurrentRequests }),
    tokensPerDay: t.field({ type: 'Count', nullable: true, resolve: (l) => l.tokensPerDay }),
    tokensPerMonth: t.field({ type: 'Count', nullable: true, resolve: (l) => l.tokensPerMonth }),
    spendPerMonth: t.float({
      nullable: true,
      resolve: (l) => (l.spendPerMonth === null ? null : Number(l.spendPerMonth)),
    }),
    declared: t.exposeBoolean('declared', { description: 'Read from hangar.yaml: change it there.' }),
    usage: t.field({ type: [LimitUsageRef], resolve: (l) => l.usage }),
    refused: t.int({
      description: 'Requests this limit refused since the answering server started.',
      resolve: (l) => l.refused,
    }),
    refusedBy: t.field({
      type: [LimitRefuserRef],
      description:
        'Who this limit is refusing: the callers it refused most over the last minute window (the current minute and the one before), as the answering server counted them; at most `top` (up to 100).',
      args: { top: t.arg.int({ required: false, defaultValue: 5 }) },
      resolve: (l, args, ctx) => ctx.services.limits.refusedBy(l.id, args.top ?? 5),
    }),
    updatedAt: t.expose('updatedAt', { type: 'DateTime' }),
  }),
});

const LimitInput = builder.inputType('LimitInput', {
  description: 'Each kind optional; one left out is not limited. 0 refuses every request.',
  fields: (t) => ({
    requestsPerMinute: t.int({ required: false }),
    tokensPerMinute: t.int({ required: false }),
    concurrentRequests: t.int({ required: false }),
    tokensPerDay: t.field({ type: 'Count', required: false }),
    tokensPerMonth: t.field({ type: 'Count', required: false }),
    spendPerMonth: t.float({ required: false, description: "In the site's currency, cents at most." }),
  }),
});

const SCOPE_HELP =
  'key:<API token id>, user:<email>, team:<org>/<team>, project:<org>/<team>/<project> or org:<org> (or the id).';

builder.queryFields((t) => ({
  limits: t.field({
    type: [LimitRef],
    description: `Limits an admin sees all of, and anyone else those on scopes they are in. scope: one scope's (${SCOPE_HELP})`,
    authScopes: { viewer: true },
    errors: { types: [ValidationError] },
    args: { scope: t.arg.string({ required: false }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.limits.limits(ctx.actor, args.scope)),
  }),
}));

builder.mutationFields((t) => ({
  setLimit: t.field({
    type: LimitRef,
    description: `Sets the limits of a scope (${SCOPE_HELP}), for every model or one model or adapter; replaces what it had. Takes effect on the next request in every server process.`,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ForbiddenError] },
    args: {
      scope: t.arg.string({ required: true }),
      model: t.arg.string({ required: false }),
      limit: t.arg({ type: LimitInput, required: true }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.limits.setLimit(ctx.actor, { scope: args.scope, model: args.model, limit: args.limit }),
      ),
  }),
  removeLimit: t.field({
    type: LimitRef,
    description: 'Removes the limits of a scope for every model (no model) or for one model; returns what was removed.',
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ForbiddenError] },
    args: { scope: t.arg.string({ required: true }), model: t.arg.string({ required: false }) },
    resolve: async (_root, args, ctx) =>
      unwrap(await ctx.services.limits.removeLimit(ctx.actor, { scope: args.scope, model: args.model })),
  }),
}));

builder.prismaObjectField(ApiTokenRef, 'limits', (t) =>
  t.field({
    type: [LimitRef],
    description: "This token's own limits (key:<id>) with what is left of each: for its owner and admins.",
    select: { id: true, userId: true },
    resolve: (tk, _args, ctx) => ctx.services.limits.tokenLimits(ctx.actor, tk),
  }),
);
