import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { withState } from '../audit/message.js';
import { hashSecret, newSecret } from '../auth/secrets.js';
import type { Context } from '../context.js';
import { asLoop, type Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import type { CatalogModel, Node, Replica } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { decide } from './placement.js';
import { endpointProblem, type SmokeResult, smokeTest } from './smoke.js';

const createNodeInput = z.object({ name: resourceName('a node name') });

const reportInput = z.object({
  gpus: z
    .array(
      z.object({
        index: z.number().int().min(0),
        name: z.string().min(1).max(200),
        totalMiB: z.number().int().min(0, 'MiB, 0 or more'),
        freeMiB: z.number().int().min(0, 'MiB, 0 or more'),
      }),
    )
    .max(64, 'at most 64 GPUs'),
  engines: z
    .array(
      z.object({
        name: z.string().min(1).max(100),
        version: z.string().max(100).nullish(),
        build: z.number().int().min(0).nullish(),
      }),
    )
    .max(16),
  diskFreeBytes: z.number().int().min(0).nullish(),
  agentVersion: z.string().max(100).nullish(),
});

/** A node is online while it has been seen within this window; its replicas are shown as lost after it. */
export const NODE_ONLINE_MS = 30_000;

const PLACEMENT_LOCK = 0x706c6163; // 'plac'
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

/** A smoke test claimed by a server holds the replica this long; a server that dies leaves it to the next. */
const SMOKE_LEASE_MS = 90_000;
/** Smoke tests one server runs at once (each is one short request). */
const SMOKE_PARALLEL = 8;

export class FleetService {
  private timer: NodeJS.Timeout | undefined;
  private placing: Promise<void> | undefined;
  /** Placement's view of the database: passes pause while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
    private readonly log?: Logger,
  ) {
    this.health = new LoopHealth('placement', log);
  }

  private agentUrlOf: () => string = () => 'http://localhost:4000';
  /** The URL agents are given (HANGAR_URL): the one sources name, so the node token goes to that origin only. */
  setAgentUrl(get: () => string) {
    this.agentUrlOf = get;
  }
  agentUrl() {
    return this.agentUrlOf();
  }

  /** Runs the placement pass now and every few seconds (node heartbeats and idle timers change the answer). */
  startPlacement(everyMs = 5000) {
    this.smoking = true;
    this.timer = setInterval(() => {
      if (!this.health.due()) return;
      void this.place();
      // Smoke tests a server that stopped (or died) left unfinished, and any whose report came in elsewhere.
      void this.claimSmokes();
    }, everyMs);
    this.place();
    void this.claimSmokes();
  }
  async stopPlacement() {
    clearInterval(this.timer);
    this.smoking = false;
    this.smokeAbort.abort(new Error('the server is stopping'));
    await this.next;
    await this.placing;
    await Promise.all([...this.smokes]);
  }

  private smoking = false;
  private smokeAbort = new AbortController();
  private readonly smokes = new Set<Promise<void>>();
  private claimingSmokes: Promise<void> | undefined;

  /**
   * Runs the smoke tests that are due: replicas whose agent said they serve, LOADING until one short request
   * through their endpoint answers. Each is claimed with a lease in PostgreSQL, so with several server replicas
   * exactly one tests it, and one left by a server that went away is taken up when its lease runs out.
   * Resolves once the tests it started (and those already running) have ended.
   */
  async smokeDue(): Promise<void> {
    await this.claimSmokes();
    await Promise.all([...this.smokes]);
  }

  private claimSmokes(): Promise<void> {
    if (!this.smoking) return Promise.resolve();
    this.claimingSmokes ??= asLoop(async () => {
      try {
        while (this.smoking && this.smokes.size < SMOKE_PARALLEL) {
          const rows = await this.db.$queryRaw<{ id: string; servingAt: Date }[]>`
            UPDATE "Replica" SET "smokeLeaseUntil" = now() + ${`${SMOKE_LEASE_MS} milliseconds`}::interval
            WHERE id = (SELECT id FROM "Replica"
                        WHERE state = 'LOADING' AND desired = 'RUN' AND "servingAt" IS NOT NULL
                          AND ("smokeLeaseUntil" IS NULL OR "smokeLeaseUntil" < now())
                        ORDER BY "servingAt" LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING id, "servingAt"`;
          const row = rows[0];
          if (!row) break;
          const run: Promise<void> = this.runSmoke(row.id, row.servingAt)
            .catch((err) => {
              if (!this.health.failed(err))
                this.log?.error('a smoke test failed to run', { replicaId: row.id, error: err });
            })
            .finally(() => {
              this.smokes.delete(run);
              // A slot is free: another may be waiting.
              if (this.smoking) void this.claimSmokes();
            });
          this.smokes.add(run);
        }
      } catch (err) {
        if (!this.health.failed(err)) this.log?.error('claiming smoke tests failed', { error: err });
      }
    }).finally(() => {
      this.claimingSmokes = undefined;
    });
    return this.claimingSmokes;
  }

  /** The engine key of a replica, for the requests the control plane sends it. Never returned by the API. */
  async engineKey(replicaId: string): Promise<string | null> {
    return (await this.db.engineKey.findUnique({ where: { replicaId } }))?.key ?? null;
  }

  /**
   * One smoke test of a replica through its endpoint, now (the serve job's smoke step): its answer, speed and
   * time to first token are kept with the replica. Does not change the replica's state.
   */
  async smokeReplica(replicaId: string, signal?: AbortSignal): Promise<SmokeResult> {
    const replica = await this.db.replica.findUnique({ where: { id: replicaId }, include: { model: true } });
    if (!replica) return { ok: false, reason: 'the replica is gone' };
    const result = await this.smokeThroughEndpoint(replica, signal);
    if (result.ok)
      await this.db.replica.updateMany({
        where: { id: replicaId, state: 'READY' },
        data: {
          smokeText: result.text,
          tokensPerSecond: result.tokensPerSecond,
          timeToFirstTokenMs: result.timeToFirstTokenMs,
          smokedAt: new Date(),
        },
      });
    return result;
  }

  /** One chat request through the replica's endpoint with its engine key; a replica lacking either fails it. */
  private async smokeThroughEndpoint(
    replica: { id: string; endpoint: string | null; model: { name: string } },
    signal?: AbortSignal,
  ): Promise<SmokeResult> {
    const key = await this.engineKey(replica.id);
    if (!replica.endpoint || !key)
      return { ok: false, reason: 'the replica has no endpoint and engine key: its agent never said where it serves' };
    return smokeTest({ endpoint: replica.endpoint, engineKey: key, model: replica.model.name, signal });
  }

  /** The claimed smoke test of one replica; its result is written only if the replica is still the one tested. */
  private async runSmoke(replicaId: string, servingAt: Date) {
    const replica = await this.db.replica.findUnique({
      where: { id: replicaId },
      include: { model: true, node: true },
    });
    if (!replica) return;
    const result = await this.smokeThroughEndpoint(replica, this.smokeAbort.signal);
    if (!result.ok && this.smokeAbort.signal.aborted) {
      // Not the replica's failure: the next start (or another server) tests it at once.
      await this.db.replica
        .updateMany({ where: { id: replicaId, servingAt }, data: { smokeLeaseUntil: null } })
        .catch(() => {});
      return;
    }
    const ctx = { viewer: { kind: 'system', name: 'smoke test' }, requestId: `smoke-${replicaId}` } as const;
    const changed = await this.db.$transaction(async (tx) => {
      const data = result.ok
        ? {
            state: 'READY' as const,
            smokeText: result.text,
            tokensPerSecond: result.tokensPerSecond,
            timeToFirstTokenMs: result.timeToFirstTokenMs,
            smokedAt: new Date(),
            smokeLeaseUntil: null,
          }
        : { state: 'FAILED' as const, message: `smoke test: ${result.reason}`, smokeLeaseUntil: null };
      // Only the replica as it was claimed: stopped meanwhile, or reloaded (a new servingAt), it is left alone.
      const u = await tx.replica.updateMany({
        where: { id: replicaId, state: 'LOADING', desired: 'RUN', servingAt },
        data,
      });
      if (u.count === 0) return false;
      if (!result.ok) await tx.engineKey.deleteMany({ where: { replicaId } });
      await this.audit.done(tx, ctx, {
        action: 'smokeTest',
        target: replica.model.name,
        message: `${replica.node?.name ?? 'a node'}: ${
          result.ok
            ? `ready: answered in ${Math.round(result.timeToFirstTokenMs)} ms to the first token, ${result.tokensPerSecond.toFixed(1)} tokens/s`
            : `smoke test: ${result.reason}`
        }`,
      });
      return true;
    });
    if (changed && !result.ok) {
      this.log?.warn('a replica failed its smoke test', {
        replicaId,
        model: replica.model.name,
        node: replica.node?.name,
        reason: result.reason,
      });
      void this.place();
    }
  }

  private next: Promise<void> | undefined;

  /**
   * One placement pass. A call while a pass runs gets the pass after it (which sees whatever changed), and
   * every call made meanwhile shares that one.
   */
  place(): Promise<void> {
    if (!this.placing) {
      this.placing = asLoop(() => this.pass())
        .then(() => this.health.ok())
        .catch((err) => {
          // The database out of reach is logged once and the pass tried again later; anything else is a bug.
          if (!this.health.failed(err)) this.log?.error('the placement pass failed', { error: err });
        })
        .finally(() => {
          this.placing = undefined;
        });
      return this.placing;
    }
    this.next ??= this.placing.then(() => {
      this.next = undefined;
      return this.place();
    });
    return this.next;
  }

  private async pass() {
    const now = new Date();
    await this.db.$transaction(async (tx) => {
      // With several server replicas, one places at a time; the others find the work done.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      const [models, nodes, replicas] = await Promise.all([
        tx.catalogModel.findMany(),
        tx.node.findMany(),
        tx.replica.findMany(),
      ]);
      const actions = decide(
        models,
        nodes.map((n) => ({ ...n, online: this.isOnline(n, now.getTime()) })),
        replicas,
        now,
      );
      for (const l of actions.lost)
        await tx.replica.update({ where: { id: l.replicaId }, data: { state: 'LOST', message: l.message } });
      const online = new Set(nodes.filter((n) => this.isOnline(n, now.getTime())).map((n) => n.id));
      for (const id of actions.stop) {
        const r = replicas.find((x) => x.id === id);
        // Nobody is running a replica that was never placed, or whose node is gone: it is stopped as of now.
        const direct = !r?.nodeId || !online.has(r.nodeId) || r.state === 'PENDING';
        await tx.replica.update({
          where: { id },
          data: direct ? { desired: 'STOP', state: 'STOPPED', message: 'stopped' } : { desired: 'STOP' },
        });
      }
      for (const id of actions.keep) await tx.replica.update({ where: { id }, data: { desired: 'RUN' } });
      for (const p of actions.place) {
        const data = { nodeId: p.nodeId, message: p.message, gpuIndex: p.gpuIndex ?? null };
        if (p.replicaId) await tx.replica.update({ where: { id: p.replicaId }, data });
        else await tx.replica.create({ data: { modelId: p.modelId, ...data } });
      }
      // Ended replicas are kept a while so an operator can see what happened, then cleared away.
      await tx.replica.deleteMany({
        where: { state: { in: ['STOPPED', 'LOST'] }, updatedAt: { lt: new Date(now.getTime() - 10 * 60_000) } },
      });
      await tx.replica.deleteMany({
        where: { state: 'FAILED', updatedAt: { lt: new Date(now.getTime() - 30 * 60_000) } },
      });
    });
  }

  /** What a node's agent should be running or stopping. */
  assignments(nodeId: string) {
    return this.db.replica.findMany({
      where: {
        nodeId,
        OR: [
          { desired: 'RUN', state: { in: ['PENDING', 'LOADING', 'READY'] } },
          { desired: 'STOP', state: { in: ['PENDING', 'LOADING', 'READY'] } },
        ],
      },
      include: { model: { include: { adapters: { orderBy: { name: 'asc' } } } } },
      orderBy: { createdAt: 'asc' },
    });
  }

  /** An agent says how a replica is doing. Audited when it becomes ready, fails or stops; not for loading. */
  async reportReplica(ctx: Context, input: unknown): Promise<Result<Replica>> {
    if (ctx.viewer.kind !== 'node')
      return fail(new ConflictError('reportReplica is for node agents, with their node token'));
    const parsed = parseInput(reportReplicaInput, input);
    if (!parsed.ok) return parsed;
    const r = parsed.value;
    const replica = await this.db.replica.findUnique({ where: { id: r.replicaId }, include: { model: true } });
    if (!replica || replica.nodeId !== ctx.viewer.node.id) {
      return fail(new NotFoundError(`no replica ${r.replicaId} is assigned to node ${ctx.viewer.node.name}`));
    }
    if (r.state === 'READY') return this.reportServing(ctx, replica, r);
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
        await this.audit.done(tx, ctx, {
          action: 'reportReplica',
          target: replica.model.name,
          message: withState(r.state, r.message),
        });
      }
      return u;
    });
    if (r.state === 'FAILED' || r.state === 'STOPPED') void this.place();
    return ok(updated);
  }

  /**
   * The agent says a replica serves: its endpoint, engine key and what it holds are kept, and it stays LOADING
   * until the control plane's own smoke test through that endpoint answers. READY without an endpoint is a
   * replica nothing can reach (an agent from before nodes served over HTTP): recorded as FAILED, saying so.
   */
  private async reportServing(
    ctx: Context,
    replica: Replica & { model: CatalogModel },
    r: z.output<typeof reportReplicaInput>,
  ): Promise<Result<Replica>> {
    const node = ctx.viewer.kind === 'node' ? ctx.viewer.node : null;
    if (!r.endpoint || !r.engineKey) {
      const message = `the agent on ${node?.name ?? 'its node'} reported it ready without an endpoint and an engine key, so no request can reach it: run an agent of this server's version there`;
      const failed = await this.db.$transaction(async (tx) => {
        const u = await tx.replica.update({ where: { id: replica.id }, data: { state: 'FAILED', message } });
        await this.audit.done(tx, ctx, {
          action: 'reportReplica',
          target: replica.model.name,
          message: `failed: ${message}`,
        });
        return u;
      });
      void this.place();
      return ok(failed);
    }
    // The same endpoint and key again: a retry that got through before, or the agent saying that the adapters it
    // holds changed. Smoke-tested already: not again.
    const sameServing =
      replica.state === 'READY' &&
      replica.endpoint === r.endpoint &&
      (await this.engineKey(replica.id)) === r.engineKey;
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
      if (measured !== null)
        await tx.catalogModel.update({
          where: { id: replica.modelId },
          data: { measuredMemoryBytes: measured, measuredAt: new Date() },
        });
      if (!sameServing)
        await this.audit.done(tx, ctx, {
          action: 'reportReplica',
          target: replica.model.name,
          message: `serving on ${r.endpoint}; smoke test due`,
        });
      return u;
    });
    if (!sameServing) void this.claimSmokes();
    return ok(updated);
  }

  list() {
    return this.db.node.findMany({ orderBy: { name: 'asc' } });
  }

  async online(now = Date.now()) {
    const nodes = await this.db.node.findMany({
      where: { lastSeenAt: { gte: new Date(now - NODE_ONLINE_MS) } },
      orderBy: { name: 'asc' },
    });
    return nodes.filter((n) => this.isOnline(n, now));
  }

  /**
   * The llama.cpp build the fleet can be counted on for: the oldest among online nodes (a model must load on any
   * node it is placed on), or the configured default when no node reports one.
   */
  async llamaCppBuild(fallback: number, online?: Node[]): Promise<{ build: number; source: string }> {
    const builds = (online ?? (await this.online())).flatMap((n) =>
      (Array.isArray(n.engines) ? (n.engines as { name?: string; build?: number | null }[]) : [])
        .filter((e) => e.name === 'llama.cpp' && typeof e.build === 'number')
        .map((e) => ({ build: e.build as number, node: n.name })),
    );
    if (!builds.length) return { build: fallback, source: 'no node has reported its llama.cpp; assuming' };
    const oldest = builds.reduce((a, b) => (b.build < a.build ? b : a));
    return {
      build: oldest.build,
      source: builds.length > 1 ? `the oldest node (${oldest.node}) runs` : `the nodes run`,
    };
  }

  /** Seen lately, and not gone since: an agent that said it is stopping is offline at once. */
  isOnline(node: Pick<Node, 'lastSeenAt' | 'leftAt'>, now = Date.now()) {
    if (!node.lastSeenAt || now - node.lastSeenAt.getTime() >= NODE_ONLINE_MS) return false;
    return !node.leftAt || node.leftAt < node.lastSeenAt;
  }

  /**
   * An agent's heartbeat with its inventory. Audited when what the node reports changes (its first report, a
   * GPU or engine added, removed or upgraded), not at every heartbeat, which would bury the log.
   */
  async report(ctx: Context, input: unknown): Promise<Result<Node>> {
    if (ctx.viewer.kind !== 'node')
      return fail(new ConflictError('reportNode is for node agents, with their node token'));
    const parsed = parseInput(reportInput, input);
    if (!parsed.ok) return parsed;
    const r = parsed.value;
    const id = ctx.viewer.node.id;
    const before = await this.db.node.findUniqueOrThrow({ where: { id } });
    const shape = (gpus: unknown, engines: unknown) =>
      JSON.stringify([
        (Array.isArray(gpus) ? gpus : []).map((g: { name?: string; totalMiB?: number }) => [g.name, g.totalMiB]),
        (Array.isArray(engines) ? engines : []).map((e: { name?: string; build?: number | null }) => [
          e.name,
          e.build ?? null,
        ]),
      ]);
    const changed = !before.lastSeenAt || shape(before.gpus, before.engines) !== shape(r.gpus, r.engines);
    const node = await this.db.$transaction(async (tx) => {
      const n = await tx.node.update({
        where: { id },
        data: {
          gpus: r.gpus,
          engines: r.engines.map((e) => ({ name: e.name, version: e.version ?? null, build: e.build ?? null })),
          diskFreeBytes: r.diskFreeBytes == null ? null : BigInt(r.diskFreeBytes),
          agentVersion: r.agentVersion ?? null,
          lastSeenAt: new Date(),
        },
      });
      if (changed) {
        const gpus = r.gpus.map((g) => `${g.name} ${g.totalMiB} MiB`).join(', ') || 'no GPU';
        const engines = r.engines.map((e) => `${e.name}${e.build ? ` b${e.build}` : ''}`).join(', ') || 'no engine';
        await this.audit.done(tx, ctx, { action: 'reportNode', target: n.name, message: `${gpus}; ${engines}` });
      }
      // Its free GPU memory may now fit a queued training job: the agent's work list is worked out again.
      await notify(tx, 'trainWork', n.id);
      return n;
    });
    return ok(node);
  }

  /**
   * Removes a node. Refused while it holds replicas that run (or are being placed there) or a training job that
   * runs, naming them; `force` removes it anyway: its replicas are deleted and placed again on other nodes, its
   * running and queued jobs are failed with the reason. Its token is refused from the moment this commits.
   */
  async removeNode(
    ctx: Context,
    input: { name: string; force?: boolean | null },
  ): Promise<Result<{ name: string; message: string }>> {
    const parsed = parseInput(z.object({ name: resourceName('a node name'), force: z.boolean().nullish() }), input, '');
    if (!parsed.ok) return parsed;
    const { name, force } = parsed.value;
    const result = await this.db.$transaction(async (tx) => {
      // The placement pass is held off meanwhile: it must not place a new replica on a node being removed.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      const node = await tx.node.findUnique({ where: { name } });
      if (!node) return fail(new NotFoundError(`no node ${name}: see Nodes for the names`));
      const replicas = await tx.replica.findMany({
        where: { nodeId: node.id, state: { in: ['PENDING', 'LOADING', 'READY'] } },
        include: { model: { select: { name: true } } },
        orderBy: { createdAt: 'asc' },
      });
      const running = await tx.trainJob.findMany({
        where: { state: 'RUNNING', OR: [{ leaseOwner: node.id }, { nodeId: node.id }] },
        select: { id: true, name: true },
      });
      const queued = await tx.trainJob.findMany({
        where: { state: 'QUEUED', nodeId: node.id },
        select: { id: true, name: true },
      });
      const models = [...new Set(replicas.map((r) => r.model.name))];
      const holds = [
        replicas.length ? `${count(replicas.length, 'replica')} (${models.join(', ')})` : null,
        running.length ? `training job ${running.map((j) => j.name).join(', ')}` : null,
      ].filter(Boolean);
      if (holds.length && !force)
        return fail(
          new ConflictError(
            `node ${name} still runs ${holds.join(' and ')}: stop them first (set the models' mode, cancel the job), or remove it with force, which places its replicas on other nodes and fails the job`,
          ),
        );
      const reason = `node ${name} was removed`;
      for (const j of [...running, ...queued])
        await tx.trainJob.update({
          where: { id: j.id },
          data: { state: 'FAILED', message: reason, finishedAt: new Date(), leaseOwner: null, leaseUntil: null },
        });
      // Its replica rows go with it (their history is in the audit log); the pass places new ones elsewhere.
      await tx.replica.deleteMany({ where: { nodeId: node.id } });
      await tx.node.delete({ where: { id: node.id } });
      // Live connections of its agent end now; its token is looked up on every request, so it is refused at once.
      await notify(tx, 'credentials', `node:${node.id}`);
      for (const j of [...running, ...queued]) await notify(tx, 'trainJob', j.id);
      const did = [
        replicas.length
          ? `${count(replicas.length, 'replica')} of ${models.join(', ')} deleted, placed again on other nodes`
          : null,
        running.length || queued.length
          ? `training job ${[...running, ...queued].map((j) => j.name).join(', ')} failed ("${reason}")`
          : null,
      ].filter(Boolean);
      const message = `removed node ${name}${did.length ? `: ${did.join('; ')}` : ''}. An agent still running there is refused: stop it`;
      await this.audit.done(tx, ctx, { action: 'removeNode', target: name, message });
      return ok({ name, message });
    });
    if (result.ok) void this.place();
    return result;
  }

  /**
   * A new token for a node's agent, shown once; the old one is refused from the moment this commits. Until the
   * agent is started again with the new one it cannot report, and the node goes offline after NODE_ONLINE_MS.
   */
  async rotateNodeToken(ctx: Context, input: { name: string }): Promise<Result<{ node: Node; token: string }>> {
    const parsed = parseInput(z.object({ name: resourceName('a node name') }), input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    const token = newSecret('node');
    return this.db.$transaction(async (tx) => {
      const found = await tx.node.findUnique({ where: { name } });
      if (!found) return fail(new NotFoundError(`no node ${name}: see Nodes for the names`));
      const node = await tx.node.update({
        where: { id: found.id },
        data: { tokenHash: hashSecret(token), tokenChangedAt: new Date(), tokenRevokedAt: null },
      });
      await notify(tx, 'credentials', `node:${node.id}`);
      await this.audit.done(tx, ctx, {
        action: 'rotateNodeToken',
        target: name,
        message: found.tokenRevokedAt ? 'a new token after revocation' : 'the old token is refused from now',
      });
      return ok({ node, token });
    });
  }

  /**
   * Cuts a node off: its token is refused at once and no new one is made (rotateNodeToken makes one). The node
   * is offline from now, and its replicas are handled as a lost node's: replaced elsewhere.
   */
  async revokeNodeToken(ctx: Context, input: { name: string }): Promise<Result<Node>> {
    const parsed = parseInput(z.object({ name: resourceName('a node name') }), input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    const result = await this.db.$transaction(async (tx) => {
      const found = await tx.node.findUnique({ where: { name } });
      if (!found) return fail(new NotFoundError(`no node ${name}: see Nodes for the names`));
      const now = new Date();
      // A hash of a secret nobody holds: the column stays unique and non-null, and nothing matches it.
      const node = await tx.node.update({
        where: { id: found.id },
        data: { tokenHash: hashSecret(newSecret('node')), tokenChangedAt: now, tokenRevokedAt: now, leftAt: now },
      });
      await notify(tx, 'credentials', `node:${node.id}`);
      await this.audit.done(tx, ctx, {
        action: 'revokeNodeToken',
        target: name,
        message: 'its agent is refused from now; its replicas are placed elsewhere',
      });
      return ok(node);
    });
    if (result.ok) void this.place();
    return result;
  }

  /**
   * The agent says it is stopping (SIGTERM): the node is offline at once rather than after NODE_ONLINE_MS, and
   * its replicas are lost and replaced elsewhere now, as for a node that went away. Its next heartbeat (an agent
   * started again) brings it back.
   */
  async leave(ctx: Context): Promise<Result<Node>> {
    if (ctx.viewer.kind !== 'node')
      return fail(new ConflictError('leaveNode is for node agents, with their node token'));
    const id = ctx.viewer.node.id;
    const node = await this.db.$transaction(async (tx) => {
      const n = await tx.node.update({ where: { id }, data: { leftAt: new Date() } });
      const lost = await tx.replica.updateMany({
        where: { nodeId: id, state: { in: ['LOADING', 'READY'] } },
        data: { state: 'LOST', message: `node ${n.name} is shutting down (its agent said so)` },
      });
      await tx.engineKey.deleteMany({ where: { replica: { nodeId: id, state: 'LOST' } } });
      // Placed here but not started: back in line for another node.
      await tx.replica.updateMany({
        where: { nodeId: id, state: 'PENDING' },
        data: { nodeId: null, gpuIndex: null, message: `node ${n.name} is shutting down` },
      });
      await this.audit.done(tx, ctx, {
        action: 'leaveNode',
        target: n.name,
        message: `the agent is stopping${lost.count ? `; ${count(lost.count, 'replica')} to place elsewhere` : ''}`,
      });
      await notify(tx, 'trainWork', n.id);
      return n;
    });
    void this.place();
    return ok(node);
  }

  /** Registers a node and returns its agent's token, once: only its hash is kept. */
  async createNode(ctx: Context, input: unknown): Promise<Result<{ node: Node; token: string }>> {
    const parsed = parseInput(createNodeInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    if (await this.db.node.findUnique({ where: { name } }))
      return fail(new ConflictError(`a node named ${name} already exists`));
    const token = newSecret('node');
    const node = await this.db.$transaction(async (tx) => {
      const n = await tx.node.create({ data: { name, tokenHash: hashSecret(token) } });
      await this.audit.done(tx, ctx, { action: 'createNode', target: name });
      return n;
    });
    return ok({ node, token });
  }
}

const count = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
