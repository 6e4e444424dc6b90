import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { withState } from '../audit/message.js';
import type { Actor } from '../auth/actor.js';
import { recordMeasuredSize } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { CatalogModel, Replica } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { endpointProblem } from './smoke.js';

// What node agents say of their replicas (assignments, reportReplica): the replica rows' state as an agent sees
// it, the serving report that makes a smoke test due. One part of the fleet service (fleet.service.ts): a replica
// that ended asks placement for a pass, one that serves asks the smoke tests to claim it.

const reportReplicaInput = z.object({
  replicaId: z.string().uuid('the replica id, as nodeAssignments gives it'),
  state: z.enum(['LOADING', 'READY', 'FAILED', 'STOPPED'], { error: 'LOADING, READY, FAILED or STOPPED' }),
  message: z.string().max(2000).nullish(),
  smokeText: z.string().max(2000).nullish(),
  tokensPerSecond: z.number().min(0).nullish(),
  endpoint: z
    .string()
    .max(500, 'at most 500 characters')
    .superRefine((e, ctx) => {
      const problem = endpointProblem(e);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    })
    .nullish(),
  // Never echoed in a refusal (parseInput names the field, not the value).
  engineKey: z
    .string()
    .regex(/^[\x21-\x7e]{16,512}$/, '16 to 512 printable characters without spaces, as newEngineKey() makes')
    .nullish(),
  gpuLayers: z.number().int().min(0).max(100_000).nullish(),
  totalLayers: z.number().int().min(0).max(100_000).nullish(),
  vramUsedBytes: z.number().int().min(0).nullish(),
  // Absent (an agent from before it reported them) leaves the column as it is.
  adapters: z
    .array(resourceName('an adapter name'))
    .max(1000, 'at most 1000 adapters')
    .refine((a) => new Set(a).size === a.length, 'each adapter once')
    .nullish(),
});

/** The adapters a report lists, as the column's update; nothing when the report has none to say. */
function adaptersOf(r: { adapters?: string[] | null }) {
  return r.adapters == null ? {} : { adapters: r.adapters };
}

/** The engine key of a replica, for the requests the control plane sends it. Never returned by the API. */
export async function engineKeyOf(db: Db, replicaId: string): Promise<string | null> {
  return (await db.engineKey.findUnique({ where: { replicaId } }))?.key ?? null;
}

export type FleetReplicasDeps = {
  db: Db;
  audit: AuditService;
  /** Asks for a placement pass: an ended replica is replaced. */
  placement: { place(): Promise<void> };
  /** Asks for the due smoke tests to be claimed: a replica that says it serves is tested before it is READY. */
  smokes: { claim(): Promise<void> };
};

export class FleetReplicas {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly placement: { place(): Promise<void> };
  private readonly smokes: { claim(): Promise<void> };

  constructor({ db, audit, placement, smokes }: FleetReplicasDeps) {
    this.db = db;
    this.audit = audit;
    this.placement = placement;
    this.smokes = smokes;
  }

  assignments(nodeId: string) {
    return this.db.replica.findMany({
      where: {
        nodeId,
        OR: [
          { desired: 'RUN', state: { in: ['PENDING', 'LOADING', 'READY'] } },
          { desired: 'STOP', state: { in: ['PENDING', 'LOADING', 'READY'] } },
        ],
      },
      // The node's cards: the share of each a replica was booked is what vLLM is told it may take.
      include: { model: { include: { adapters: { orderBy: { name: 'asc' } } } }, node: { select: { gpus: true } } },
      orderBy: { createdAt: 'asc' },
    });
  }

  /** An agent says how a replica is doing. Audited when it becomes ready, fails or stops; not for loading. */
  // Untyped on purpose: the schema's ReplicaState also holds the states only Hangar sets (LOST, …), which a node
  // may not report; reportReplicaInput refuses them, naming the field.
  async reportReplica(actor: Actor, input: unknown): Promise<Result<Replica>> {
    if (actor.viewer.kind !== 'node')
      return fail(new ConflictError('reportReplica is for node agents, with their node token'));
    const parsed = parseInput(reportReplicaInput, input);
    if (!parsed.ok) return parsed;
    const r = parsed.value;
    const replica = await this.db.replica.findUnique({ where: { id: r.replicaId }, include: { model: true } });
    if (!replica || replica.nodeId !== actor.viewer.node.id) {
      return fail(new NotFoundError(`no replica ${r.replicaId} is assigned to node ${actor.viewer.node.name}`));
    }
    if (r.state === 'READY') return this.reportServing(actor, replica, r);
    // A replica the control plane failed (its smoke test) stays failed, with that reason, when its agent then
    // stops it: the operator needs to see why it went, not that it stopped.
    const keepFailure = replica.state === 'FAILED' && r.state === 'STOPPED';
    const updated = await this.db.$transaction(async (tx) => {
      const u = await tx.replica.update({
        where: { id: replica.id },
        data: keepFailure
          ? adaptersOf(r)
          : {
              ...adaptersOf(r),
              state: r.state,
              message: r.message ?? null,
              // Loading again (an agent that restarted, say): the endpoint and key it had are no longer what
              // it serves, and a smoke test of them would fail a replica that is about to come up.
              servingAt: null,
              smokeLeaseUntil: null,
            },
      });
      // An ended or reloading replica's key opens nothing any more: it is not kept.
      await tx.engineKey.deleteMany({ where: { replicaId: u.id } });
      if (r.state !== 'LOADING' && !keepFailure) {
        await this.audit.done(tx, actor, {
          action: 'reportReplica',
          target: replica.model.name,
          message: withState(r.state, r.message),
          owner: replica.model.owner,
        });
      }
      return u;
    });
    if (r.state === 'FAILED' || r.state === 'STOPPED') void this.placement.place();
    return ok(updated);
  }

  /**
   * The agent says a replica serves: its endpoint, engine key and what it holds are kept, and it stays LOADING
   * until the control plane's own smoke test through that endpoint answers. READY without an endpoint is a
   * replica nothing can reach (an agent from before nodes served over HTTP): recorded as FAILED, saying so.
   */
  private async reportServing(
    actor: Actor,
    replica: Replica & { model: CatalogModel },
    r: z.output<typeof reportReplicaInput>,
  ): Promise<Result<Replica>> {
    const node = actor.viewer.kind === 'node' ? actor.viewer.node : null;
    if (!r.endpoint || !r.engineKey) {
      const message = `the agent on ${node?.name ?? 'its node'} reported it ready without an endpoint and an engine key, so no request can reach it: run an agent of this server's version there`;
      const failed = await this.db.$transaction(async (tx) => {
        const u = await tx.replica.update({ where: { id: replica.id }, data: { state: 'FAILED', message } });
        await this.audit.done(tx, actor, {
          action: 'reportReplica',
          target: replica.model.name,
          message: `failed: ${message}`,
          owner: replica.model.owner,
        });
        return u;
      });
      void this.placement.place();
      return ok(failed);
    }
    // The same endpoint and key again: a retry that got through before, or the agent saying that the adapters it
    // holds changed. Smoke-tested already: not again.
    const sameServing =
      replica.state === 'READY' &&
      replica.endpoint === r.endpoint &&
      (await engineKeyOf(this.db, replica.id)) === r.engineKey;
    const measured =
      r.vramUsedBytes != null && r.gpuLayers != null && r.totalLayers != null && r.gpuLayers >= r.totalLayers
        ? BigInt(r.vramUsedBytes)
        : null;
    const updated = await this.db.$transaction(async (tx) => {
      const memory = {
        gpuLayers: r.gpuLayers ?? null,
        totalLayers: r.totalLayers ?? null,
        vramUsedBytes: r.vramUsedBytes == null ? null : BigInt(r.vramUsedBytes),
      };
      // What the agent says of the load now (an adapter added, or refused and why) replaces what it said before.
      const u = sameServing
        ? await tx.replica.update({
            where: { id: replica.id },
            data: { ...memory, ...adaptersOf(r), ...(r.message != null ? { message: r.message } : {}) },
          })
        : await tx.replica.update({
            where: { id: replica.id },
            data: {
              ...memory,
              ...adaptersOf(r),
              state: 'LOADING',
              endpoint: r.endpoint,
              servingAt: new Date(),
              smokeLeaseUntil: null,
              smokeText: null,
              tokensPerSecond: null,
              timeToFirstTokenMs: null,
              smokedAt: null,
              // What the agent said of the load (context, layers on the GPU, adapters) stays the message; the
              // smoke test's numbers have columns of their own.
              message: r.message ?? 'loaded',
            },
          });
      await tx.engineKey.upsert({
        where: { replicaId: replica.id },
        create: { replicaId: replica.id, key: r.engineKey as string },
        update: { key: r.engineKey as string },
      });
      // Fully offloaded, what the card holds is the model's real need, to set against the plan's estimate.
      if (measured !== null) await recordMeasuredSize(tx, replica.modelId, measured);
      if (!sameServing)
        await this.audit.done(tx, actor, {
          action: 'reportReplica',
          target: replica.model.name,
          message: `serving on ${r.endpoint}; smoke test due`,
          owner: replica.model.owner,
        });
      return u;
    });
    if (!sameServing) void this.smokes.claim();
    return ok(updated);
  }
}
