import type { ObjectRef } from '@pothos/core';
import { ApiTokenRef } from '../access/access.schema.js';
import { roleAtLeast, viewerRole } from '../auth/viewer.js';
import { CatalogModelRef } from '../catalog/catalog.schema.js';
import type { Context } from '../context.js';
import { ReplicaRef } from '../fleet/fleet.schema.js';
import { type Result, unwrap, ValidationError } from '../lib/errors.js';
import { seenOwners } from '../org/org-owners.js';
import { sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import {
  USAGE_MAX_DAYS,
  USAGE_MAX_POINTS,
  USAGE_MAX_STEP_MINUTES,
  type Usage,
  type UsagePoint,
  type UsageTotals,
} from './usage.service.js';

const UsageTotalsRef = builder.objectRef<UsageTotals>('UsageTotals');
const UsagePointRef = builder.objectRef<UsagePoint>('UsagePoint');

type Types = typeof builder extends PothosSchemaTypes.SchemaBuilder<infer T> ? T : never;

UsageTotalsRef.implement({
  description: 'Requests and tokens over a range, as the gateway recorded them per minute.',
});
UsagePointRef.implement({
  description: 'One step of a usage series; a step with no requests is all zeros (and null latencies).',
  fields: (t) => ({ at: t.expose('at', { type: 'DateTime', description: "The step's start." }) }),
});
withUsageFields(UsageTotalsRef);
withUsageFields(UsagePointRef);

export const UsageRef = builder.objectRef<Usage>('Usage').implement({
  description: 'Usage per step from `from` (its minute) to `to`, every step present, and the totals over all of it.',
  fields: (t) => ({
    from: t.expose('from', {
      type: 'DateTime',
      description:
        "The first step's start: `from` down to its minute; down to its hour (or day) where usage that old is kept per hour (or day) alone (HANGAR_USAGE_RETENTION).",
    }),
    to: t.expose('to', { type: 'DateTime' }),
    step: t.exposeInt('stepMinutes', { description: 'Minutes per point.' }),
    points: t.field({ type: [UsagePointRef], resolve: (u) => u.points }),
    totals: t.field({ type: UsageTotalsRef, resolve: (u) => u.totals }),
  }),
});

/** The counts a point and the totals share. */
function withUsageFields<T extends UsageTotals>(ref: ObjectRef<Types, T>) {
  builder.objectFields(ref, (t) => {
    const count = (
      name: 'requests' | 'errors' | 'aborted' | 'promptTokens' | 'completionTokens' | 'cachedTokens',
      description: string,
    ) => t.field({ type: 'Count', description, resolve: (u) => u[name] });
    return {
      requests: count('requests', 'Requests answered, failed or aborted.'),
      errors: count('errors', 'Requests answered with an error, by the gateway or the replica.'),
      aborted: count('aborted', 'Requests the client ended before the answer was complete.'),
      promptTokens: count(
        'promptTokens',
        "Prompt tokens, as the engine's usage counted them; for an answer that ended before the engine said (the client left, the replica went away), estimated from the request at a token per 4 characters.",
      ),
      completionTokens: count(
        'completionTokens',
        "Completion tokens, as the engine's usage counted them; for a stream that ended before the engine said, the chunks carrying a token that the client was sent.",
      ),
      cachedTokens: count(
        'cachedTokens',
        "Of the prompt tokens, those the replica reused from its prompt cache instead of computing them (OpenAI's usage.prompt_tokens_details.cached_tokens, as the engine reported it); 0 where an engine reports none.",
      ),
      tokensPerSecond: t.float({
        description: 'Completion tokens over the seconds the step (or, in totals, the range) covers.',
        resolve: (u) => u.tokensPerSecond,
      }),
      p50Ms: t.float({
        nullable: true,
        description:
          'Half the requests took at most this long, in ms: the upper bound of the histogram bucket (50, 100, 250, 500 ms, 1, 2.5, 5, 10, 30, 60, 120 s) the median falls in; 120000 also stands for longer. Null with no requests.',
        resolve: (u) => u.p50Ms,
      }),
      p95Ms: t.float({
        nullable: true,
        description: '95% of the requests took at most this long, in ms; read as p50Ms is.',
        resolve: (u) => u.p95Ms,
      }),
      meanTtftMs: t.float({
        nullable: true,
        description: 'The mean time to the first token, in ms, over the requests that got one; null when none did.',
        resolve: (u) => u.meanTtftMs,
      }),
    };
  });
}

builder.queryField('usage', (t) =>
  t.field({
    type: UsageRef,
    description:
      "What the gateway served, per step. OPERATOR and above read every caller's usage; a VIEWER reads their own tokens' and sessions' alone (another user's token reads as no usage).",
    authScopes: { viewer: true },
    errors: { types: [ValidationError] },
    args: {
      model: t.arg.string({ required: false }),
      adapter: t.arg.string({
        required: false,
        description: 'An adapter name; "" is requests to the base model alone. Absent: all of them.',
      }),
      token: t.arg.id({ required: false, description: 'An API token id; "" is console sessions (the playground).' }),
      replica: t.arg.id({
        required: false,
        description:
          "A replica's id, as the x-hangar-replica header of each /v1 answer names it: the usage it served alone.",
      }),
      from: t.arg({ type: 'DateTime', required: true }),
      to: t.arg({
        type: 'DateTime',
        required: true,
        description: `After from, at most ${USAGE_MAX_DAYS} days later.`,
      }),
      step: t.arg.int({
        required: false,
        defaultValue: 1,
        description: `Minutes per point, 1 to ${USAGE_MAX_STEP_MINUTES}; at most ${USAGE_MAX_POINTS} points in all.`,
      }),
    },
    resolve: async (_root, args, ctx, info) => {
      const filter = {
        model: args.model,
        adapter: args.adapter,
        token: args.token == null ? null : String(args.token),
        replica: args.replica == null ? null : String(args.replica),
        from: args.from,
        to: args.to,
        step: args.step,
      };
      const owners = seenOwners(await sightOf(ctx, info));
      // What was asked travels with the answer: Usage.cost (governance/cost.schema.ts) prices the same rows.
      return { ...unwrap(await ctx.services.usage.usage(ctx.viewer, filter, owners)), asked: { filter, owners } };
    },
  }),
);

builder.objectField(ApiTokenRef, 'usage', (t) =>
  t.field({
    type: UsageTotalsRef,
    description:
      'What this token was used for from `from` to `to` (at most 31 days). All tokens of one answer are read in one query.',
    errors: { types: [ValidationError] },
    args: {
      from: t.arg({ type: 'DateTime', required: true }),
      to: t.arg({ type: 'DateTime', required: true }),
    },
    resolve: async (token, args, ctx) => unwrap(await tokenTotals(ctx, token.id, args.from, args.to)),
  }),
);

type Batch = { ids: string[]; answer: Promise<Result<Map<string, UsageTotals>>> };
const batches = new WeakMap<Context, Map<string, Batch>>();

/**
 * The Tokens page lists every token with its usage: the rows of one request that ask for the same range are
 * gathered (they resolve in the same tick) and read with one query, not one per token.
 */
async function tokenTotals(ctx: Context, id: string, from: Date, to: Date): Promise<Result<UsageTotals>> {
  const perRange = batches.get(ctx) ?? new Map<string, Batch>();
  batches.set(ctx, perRange);
  const key = `${from.toISOString()}/${to.toISOString()}`;
  let batch = perRange.get(key);
  if (!batch) {
    const ids: string[] = [];
    const answer = new Promise<void>((r) => process.nextTick(r)).then(() => {
      perRange.delete(key);
      return ctx.services.usage.totalsByToken(ctx.viewer, ids, from, to);
    });
    batch = { ids, answer };
    perRange.set(key, batch);
  }
  batch.ids.push(id);
  const result = await batch.answer;
  if (!result.ok) return result;
  const totals = result.value.get(id);
  if (!totals) throw new Error(`usage totals for token ${id} were not read`);
  return { ok: true, value: totals };
}

// Load, as this server's gateway sees it now: requests in flight are counted in the process that proxies them, so
// with several server replicas each shows its own share (the numbers are not summed across them).
builder.objectFields(ReplicaRef, (t) => ({
  inFlight: t.int({
    description: "Requests this server's gateway is proxying to the replica now.",
    resolve: (r, _args, ctx) => ctx.services.gateway.load(r.id).inFlight,
  }),
  failing: t.string({
    nullable: true,
    description:
      'Why the gateway routes around the replica for now (refused the connection, timed out or answered 5xx before the first byte); null when it takes requests. Viewers are told only that it is set aside: the reason can name its endpoint.',
    resolve: (r, _args, ctx) => {
      const why = ctx.services.gateway.load(r.id).failing;
      if (why === null) return null;
      const role = viewerRole(ctx.viewer);
      return role && roleAtLeast(role, 'OPERATOR') ? why : 'set aside after a failed request (an operator sees why)';
    },
  }),
}));

builder.objectField(CatalogModelRef, 'waiting', (t) =>
  t.int({
    description: "Requests waiting in this server's gateway for the model to wake (on demand, no replica ready yet).",
    resolve: (m, _args, ctx) => ctx.services.gateway.waiting(m.name),
  }),
);
