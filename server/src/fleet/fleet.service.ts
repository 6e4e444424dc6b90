import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { hashSecret, newSecret } from '../auth/secrets.js';
import type { Context } from '../context.js';
import type { Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import type { Node, Replica } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { decide } from './placement.js';

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
});

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

  /** Runs the placement pass now and every few seconds (node heartbeats and idle timers change the answer). */
  startPlacement(everyMs = 5000) {
    this.timer = setInterval(() => {
      if (this.health.due()) void this.place();
    }, everyMs);
    this.place();
  }
  async stopPlacement() {
    clearInterval(this.timer);
    await this.next;
    await this.placing;
  }

  private next: Promise<void> | undefined;

  /**
   * One placement pass. A call while a pass runs gets the pass after it (which sees whatever changed), and
   * every call made meanwhile shares that one.
   */
  place(): Promise<void> {
    if (!this.placing) {
      this.placing = this.pass()
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
      for (const p of actions.place) {
        if (p.replicaId)
          await tx.replica.update({ where: { id: p.replicaId }, data: { nodeId: p.nodeId, message: p.message } });
        else await tx.replica.create({ data: { modelId: p.modelId, nodeId: p.nodeId, message: p.message } });
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
    const updated = await this.db.$transaction(async (tx) => {
      const u = await tx.replica.update({
        where: { id: replica.id },
        data: {
          state: r.state,
          message: r.message ?? (r.state === 'READY' ? 'ready' : null),
          smokeText: r.smokeText ?? undefined,
          tokensPerSecond: r.tokensPerSecond ?? undefined,
        },
      });
      if (r.state !== 'LOADING') {
        const detail =
          r.state === 'READY' && r.tokensPerSecond
            ? `, smoke test ${r.tokensPerSecond.toFixed(1)} tokens/s`
            : r.message
              ? `: ${r.message}`
              : '';
        await this.audit.done(tx, ctx, {
          action: 'reportReplica',
          target: replica.model.name,
          message: `${r.state.toLowerCase()}${detail}`,
        });
      }
      return u;
    });
    if (r.state === 'FAILED' || r.state === 'STOPPED') void this.place();
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
    return nodes;
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

  isOnline(node: Pick<Node, 'lastSeenAt'>, now = Date.now()) {
    return Boolean(node.lastSeenAt && now - node.lastSeenAt.getTime() < NODE_ONLINE_MS);
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
