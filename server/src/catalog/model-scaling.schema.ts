import { ReplicaRef } from '../fleet/fleet.schema.js';
import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { CatalogModelRef } from './catalog.schema.js';

// Autoscaling as scripts and the console see it: setModelScaling (its name and arguments are for scripts: kept as
// they are), a model's bounds and target, the autoscaler's recent decisions with their reasons (from the audit
// log, where each is written), and whether a replica is draining.

/** Decisions listed on a model's page: enough to see a day's pattern without a page of its own. */
const DECISIONS_SHOWN = 10;

type Decision = { at: Date; message: string };
const ScalingDecisionRef = builder.objectRef<Decision>('ScalingDecision').implement({
  description:
    'One decision of the autoscaler, with its reason: "3.4 in flight per replica for 60 s, target 2: 2 → 3".',
  fields: (t) => ({
    at: t.expose('at', { type: 'DateTime' }),
    message: t.exposeString('message'),
  }),
});

builder.objectFields(CatalogModelRef, (t) => ({
  minReplicas: t.exposeInt('minReplicas', { description: 'The fewest replicas it runs; 0 is on demand.' }),
  maxReplicas: t.exposeInt('maxReplicas', { description: 'The most replicas it runs; 0 is stopped.' }),
  targetInFlight: t.exposeFloat('targetInFlight', {
    nullable: true,
    description:
      'Requests in flight per READY replica (waiting ones counted in) the autoscaler keeps it near, between minReplicas and maxReplicas (setModelScaling); null: a fixed count (setModelMode).',
  }),
  scalingDecisions: t.field({
    type: [ScalingDecisionRef],
    description: `The autoscaler's last ${DECISIONS_SHOWN} decisions for it, newest first, each with its reason.`,
    resolve: async (m, _args, ctx) => {
      const page = await ctx.services.audit.page(DECISIONS_SHOWN * 2, undefined, {
        action: 'scaleModel',
        target: m.name,
      });
      if (!page.ok) return [];
      // The filter matches within names ("tiny" in "tiny-2"): this model's own rows only.
      return page.value.rows
        .filter((r) => r.action === 'scaleModel' && r.target === m.name)
        .slice(0, DECISIONS_SHOWN)
        .map((r) => ({ at: r.at, message: r.message ?? '' }));
    },
  }),
}));

builder.objectFields(ReplicaRef, (t) => ({
  drainingSince: t.expose('drainingSince', {
    type: 'DateTime',
    nullable: true,
    description:
      'Since when it is being removed: it takes no new requests and finishes those it has (up to HANGAR_DRAIN_GRACE_SECONDS), then stops.',
  }),
}));

builder.mutationFields((t) => ({
  setModelScaling: t.field({
    type: CatalogModelRef,
    description:
      'Autoscales a model: a replica is added while the requests in flight per replica stay above targetInFlight for HANGAR_SCALE_WINDOW_SECONDS, and one drained and removed while they stay low enough, between minReplicas (0: on demand, woken by a request) and maxReplicas.',
    authScopes: { operator: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: {
      name: t.arg.string({ required: true }),
      minReplicas: t.arg.int({ required: true }),
      maxReplicas: t.arg.int({ required: true }),
      targetInFlight: t.arg.float({ required: true }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.catalog.setScaling(ctx.actor, args)),
  }),
}));
