import { UsageRef } from '../gateway/usage.schema.js';
import type { Price } from '../generated/prisma/client.js';
import { ConflictError, unwrap, ValidationError } from '../lib/errors.js';
import { seenOwners } from '../org/org-owners.js';
import { sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import {
  COST_MAX_DAYS,
  COST_MAX_POINTS,
  type CostFigures,
  type CostLine,
  type CostPoint,
  type CostReport,
  cents,
  perMillionTokens,
} from './cost.service.js';

// Prices (ADMIN sets them, OPERATOR reads them) and what calls cost (costReport, ADMIN; Usage.cost, whoever reads
// the usage). Money is a decimal string in the site's currency (HANGAR_CURRENCY): cents in a report, the price's own
// places in a price, so a script adds them up exactly.

const PriceTargetRef = builder.enumType('PriceTarget', {
  description: 'What a price is for.',
  values: {
    NODE: { description: 'A node, by name: its price per GPU-hour.' },
    GPU: {
      description:
        'A GPU model, by the name its agent reports: the price per GPU-hour of nodes that have none of their own.',
    },
    MODEL: { description: 'A model, by name: a fixed price per million tokens instead of its GPU time.' },
  },
});

const CostDimensionRef = builder.enumType('CostDimension', {
  description: 'What the lines of a cost report are grouped by.',
  values: {
    SCOPE: { description: 'The caller: key:<token> for an API token, user:<email> for console sessions.' },
    TEAM: {
      description:
        "Each team the caller belongs to (the token's memberships and its user's); a caller in two teams is counted in each, one in none has no team.",
    },
    MODEL: { description: 'The model called.' },
    NODE: { description: 'The node that answered.' },
  },
});

// A price as set, never shorter than cents: "2.40", "0.0004".
const money = (d: { toFixed(n?: number): string; decimalPlaces(): number } | null | undefined) =>
  d == null ? null : d.toFixed(Math.max(2, d.decimalPlaces()));

const PriceRef = builder.objectRef<Price>('Price').implement({
  description: 'A price the operator set or declared in hangar.yaml, in the site currency.',
  fields: (t) => ({
    target: t.field({ type: PriceTargetRef, resolve: (p) => p.target }),
    name: t.exposeString('name'),
    perGpuHour: t.string({ nullable: true, resolve: (p) => money(p.perGpuHour) }),
    perMillionPromptTokens: t.string({ nullable: true, resolve: (p) => money(p.perMillionPromptTokens) }),
    perMillionCompletionTokens: t.string({ nullable: true, resolve: (p) => money(p.perMillionCompletionTokens) }),
    declared: t.exposeBoolean('declared', { description: 'From hangar.yaml: changed there, not through the API.' }),
    currency: t.string({ resolve: (_p, _a, ctx) => ctx.config.currency }),
    updatedAt: t.expose('updatedAt', { type: 'DateTime' }),
  }),
});

const CostTotalsRef = builder.objectRef<CostFigures>('CostTotals');
const CostLineRef = builder.objectRef<CostLine>('CostLine');
for (const ref of [CostTotalsRef, CostLineRef] as const) {
  builder.objectFields(ref as typeof CostTotalsRef, (t) => ({
    requests: t.field({ type: 'Count', resolve: (f) => f.requests }),
    promptTokens: t.field({ type: 'Count', resolve: (f) => f.promptTokens }),
    completionTokens: t.field({ type: 'Count', resolve: (f) => f.completionTokens }),
    gpuHours: t.float({
      description: 'GPU-hours: those the calls were served in, or on an idle line those held serving nobody.',
      resolve: (f) => f.gpuHours.toDecimalPlaces(6).toNumber(),
    }),
    cost: t.string({ description: 'What the calls cost, to the cent.', resolve: (f) => cents(f.cost) }),
    idleCost: t.string({
      description: 'What replicas cost while they served nobody (the price of keeping a model ready), to the cent.',
      resolve: (f) => cents(f.idleCost),
    }),
    totalCost: t.string({
      description: 'cost + idleCost, to the cent.',
      resolve: (f) => cents(f.cost.plus(f.idleCost)),
    }),
    perMillionTokens: t.string({
      nullable: true,
      description:
        'What a million tokens (prompt and completion) cost here, idle time included, to a hundredth of a cent; null with no tokens.',
      resolve: (f) => perMillionTokens(f)?.toDecimalPlaces(4).toFixed(4) ?? null,
    }),
  }));
}
CostTotalsRef.implement({ description: 'Cost over a whole report.' });
CostLineRef.implement({
  description:
    'Cost of one group of calls; a line with no scope (when grouped by SCOPE or TEAM) is idle time, which is no caller’s.',
  fields: (t) => ({
    idle: t.boolean({
      description: 'Idle GPU time alone (grouped by SCOPE or TEAM, where it is no caller’s); false elsewhere.',
      resolve: (l) => l.idle,
    }),
    scope: t.string({ nullable: true, description: 'key:<token id> or user:<user id>.', resolve: (l) => l.scope }),
    scopeLabel: t.string({
      nullable: true,
      description: 'The scope for people: key:ci-deploy (alice@example.com), user:alice@example.com.',
      resolve: (l) => l.scopeLabel,
    }),
    team: t.string({ nullable: true, description: 'team:<org>/<team>.', resolve: (l) => l.team }),
    model: t.string({ nullable: true, resolve: (l) => l.model }),
    node: t.string({ nullable: true, resolve: (l) => l.node }),
  }),
});

const CostPointRef = builder.objectRef<CostPoint>('CostPoint').implement({
  description: 'One step of a cost report, for a chart: every step present, zeros where nothing ran.',
  fields: (t) => ({
    at: t.expose('at', { type: 'DateTime', description: "The step's start." }),
    cost: t.string({ resolve: (p) => cents(p.cost) }),
    idleCost: t.string({ resolve: (p) => cents(p.idleCost) }),
  }),
});

const CostReportRef = builder.objectRef<CostReport>('CostReport').implement({
  description: 'What calls and idle GPU time cost from `from` to `to`, grouped as asked, with a point per step.',
  fields: (t) => ({
    from: t.expose('from', { type: 'DateTime', description: '`from` down to its minute.' }),
    to: t.expose('to', { type: 'DateTime' }),
    step: t.exposeInt('stepMinutes', { description: 'Minutes per point.' }),
    currency: t.exposeString('currency', { description: 'HANGAR_CURRENCY: what every amount is in.' }),
    by: t.field({ type: [CostDimensionRef], resolve: (r) => r.by }),
    lines: t.field({ type: [CostLineRef], description: 'Most costly first.', resolve: (r) => r.lines }),
    points: t.field({ type: [CostPointRef], resolve: (r) => r.points }),
    total: t.field({ type: CostTotalsRef, resolve: (r) => r.total }),
    unpricedGpuHours: t.float({
      description:
        'GPU-hours held on nodes with no price (neither their own nor their GPU model’s): counted, but costing nothing here. Set one with setNodePrice or setGpuPrice.',
      resolve: (r) => r.unpricedGpuHours.toDecimalPlaces(6).toNumber(),
    }),
  }),
});

builder.queryFields((t) => ({
  costReport: t.field({
    type: CostReportRef,
    description:
      "What calls cost: each replica's GPU time at its node's price, divided among the requests it served by their tokens, and idle time apart. ADMIN.",
    authScopes: { admin: true },
    errors: { types: [ValidationError] },
    args: {
      from: t.arg({ type: 'DateTime', required: true }),
      to: t.arg({ type: 'DateTime', required: true, description: `After from, at most ${COST_MAX_DAYS} days later.` }),
      by: t.arg({ type: [CostDimensionRef], required: false, description: 'Empty or absent: one line, the total.' }),
      scope: t.arg.string({
        required: false,
        description:
          'Only the calls of callers this owner admits: team:<org/team>, project:<org/team/project>, org:<org>, user:<email>, key:<token id>. Idle time is then left out (it is no caller’s).',
      }),
      model: t.arg.string({ required: false }),
      step: t.arg.int({
        required: false,
        description: `Minutes per point; by default an hour for up to 4 days, a day beyond; at most ${COST_MAX_POINTS} points.`,
      }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.cost.report(ctx.viewer, {
          from: args.from,
          to: args.to,
          by: args.by ?? [],
          scope: args.scope,
          model: args.model,
          step: args.step,
        }),
      ),
  }),
  prices: t.field({
    type: [PriceRef],
    description: 'The prices set, by target and name. OPERATOR and above.',
    authScopes: { operator: true },
    args: { target: t.arg({ type: PriceTargetRef, required: false }) },
    resolve: (_root, args, ctx) => ctx.services.cost.prices(args.target),
  }),
}));

builder.mutationFields((t) => ({
  setNodePrice: t.field({
    type: PriceRef,
    nullable: true,
    description: "Sets a node's price per GPU-hour (null removes it: its GPU model's price applies). ADMIN, audited.",
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      node: t.arg.string({ required: true }),
      perGpuHour: t.arg.string({
        required: false,
        description: 'A decimal in the site currency ("2.40"); null removes it.',
      }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.cost.setPrice(
          ctx.actor,
          { target: 'NODE', name: args.node, perGpuHour: args.perGpuHour },
          'setNodePrice',
        ),
      ),
  }),
  setGpuPrice: t.field({
    type: PriceRef,
    nullable: true,
    description:
      'Sets the price per GPU-hour of a GPU model, by the name agents report (nodes list it), for nodes without a price of their own. ADMIN, audited.',
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      gpu: t.arg.string({ required: true }),
      perGpuHour: t.arg.string({
        required: false,
        description: 'A decimal in the site currency ("2.10"); null removes it.',
      }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.cost.setPrice(
          ctx.actor,
          { target: 'GPU', name: args.gpu, perGpuHour: args.perGpuHour },
          'setGpuPrice',
        ),
      ),
  }),
  setModelPrice: t.field({
    type: PriceRef,
    nullable: true,
    description:
      "Sets a fixed price per million tokens for a model's calls, in place of its GPU time (both null removes it). ADMIN, audited.",
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      model: t.arg.string({ required: true }),
      perMillionPromptTokens: t.arg.string({ required: false, description: 'A decimal in the site currency.' }),
      perMillionCompletionTokens: t.arg.string({ required: false, description: 'A decimal in the site currency.' }),
    },
    resolve: async (_root, args, ctx) =>
      unwrap(
        await ctx.services.cost.setPrice(
          ctx.actor,
          {
            target: 'MODEL',
            name: args.model,
            perMillionPromptTokens: args.perMillionPromptTokens,
            perMillionCompletionTokens: args.perMillionCompletionTokens,
          },
          'setModelPrice',
        ),
      ),
  }),
}));

builder.objectField(UsageRef, 'cost', (t) =>
  t.string({
    nullable: true,
    description:
      'What these calls cost, to the cent, in the site currency (costReport says how); idle time is not in it. Read in one more query for the whole range, not per step.',
    resolve: async (usage, _args, ctx, info) => {
      const asked = usage.asked;
      if (!asked) return null;
      const owners = asked.owners ?? seenOwners(await sightOf(ctx, info));
      const cost = unwrap(await ctx.services.cost.callsCost(ctx.viewer, asked.filter, owners));
      return cents(cost);
    },
  }),
);
