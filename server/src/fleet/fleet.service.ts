import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, logFor } from '../auth/actor.js';
import { hashSecret, newSecret } from '../auth/secrets.js';
import { modelNamesByIds } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import type { Node } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result } from '../lib/errors.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import type { TrainLedger } from '../train/train-ledger.js';
import { count, FleetPlacement, NODE_ONLINE_MS, onlineAt, PLACEMENT_LOCK } from './fleet-placement.js';
import { FleetReplicas } from './fleet-replicas.js';
import type { GpuMargin } from './gpu-room.js';
import { nodeEngines, nodeGpus } from './node-inventory.js';
import { type PlacementEvents, PlacementSchedule } from './placement-schedule.js';
import { SmokeTests } from './smoke-tests.js';

// The fleet: its nodes (their heartbeats and inventory, their tokens, leaving and removal) here, and three parts
// it is made of, each given what it uses: the placement pass (fleet-placement.ts), the smoke tests that make a
// replica READY (smoke-tests.ts) and what agents report of their replicas (fleet-replicas.ts). Other domains and
// the schema call this one object; the parts call one another only through what they are given.

export { NODE_ONLINE_MS } from './fleet-placement.js';

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

export type FleetDeps = {
  db: Db;
  audit: AuditService;
  log?: Logger;
  /** Training's ledger: a node removed with force fails its jobs the way training fails any job (train-ledger.ts). */
  train: Pick<TrainLedger, 'failNodeJobs' | 'jobsOnNode'>;
  /** HANGAR_GPU_MEMORY_MARGIN, for the placement pass. */
  gpuMemoryMargin?: GpuMargin;
  /** HANGAR_DRAIN_GRACE_SECONDS in ms, for the placement pass's draining (drain.ts). */
  drainGraceMs?: number;
  /** HANGAR_PLACEMENT_REREAD_SECONDS in ms: the placement pass's safety net besides its events (default 60 s). */
  placementRereadMs?: number;
};

export class FleetService {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly train: Pick<TrainLedger, 'failNodeJobs' | 'jobsOnNode'>;
  /** The fleet loops' view of the database (placement, smoke tests): they pause while it is out of reach. */
  // Shared by both parts, and read by /readyz.
  readonly health: LoopHealth;
  private readonly placement: FleetPlacement;
  private readonly smokes: SmokeTests;
  private readonly replicas: FleetReplicas;
  private timer: NodeJS.Timeout | undefined;
  private schedule: PlacementSchedule | undefined;
  private readonly placementRereadMs: number;
  private stopRetrying: (() => void) | undefined;
  private agentUrlOf: () => string = () => 'http://localhost:4000';
  private readonly log?: Logger;

  constructor({ db, audit, log, train, gpuMemoryMargin, drainGraceMs, placementRereadMs }: FleetDeps) {
    this.db = db;
    this.placementRereadMs = placementRereadMs ?? 60_000;
    this.log = log;
    this.audit = audit;
    this.train = train;
    this.health = new LoopHealth('placement', log);
    this.placement = new FleetPlacement({ db, health: this.health, log, margin: gpuMemoryMargin, drainGraceMs });
    this.smokes = new SmokeTests({ db, audit, health: this.health, placement: this.placement, log });
    this.replicas = new FleetReplicas({ db, audit, placement: this.placement, smokes: this.smokes });
  }

  /** The URL agents are given (HANGAR_URL): the one sources name, so the node token goes to that origin only. */
  // Set by the app once it listens: the port a test server got is known only then.
  setAgentUrl(get: () => string) {
    this.agentUrlOf = get;
  }
  agentUrl() {
    return this.agentUrlOf();
  }

  /**
   * Runs the placement pass now, then whenever something says its answer may have changed (placement-schedule.ts:
   * the catalog's events, the nodes online, time), looking every few seconds. Without `events`, a pass every look.
   */
  startPlacement({ events, everyMs = 5000 }: { events?: PlacementEvents; everyMs?: number } = {}) {
    this.smokes.start();
    this.schedule = new PlacementSchedule({
      db: this.db,
      placement: this.placement,
      health: this.health,
      events,
      rereadMs: this.placementRereadMs,
      log: this.log,
    });
    this.schedule.start();
    this.timer = setInterval(() => {
      if (!this.health.due()) return;
      void this.schedule?.look();
      // Smoke tests a server that stopped (or died) left unfinished, and any whose report came in elsewhere.
      void this.smokes.claim();
    }, everyMs);
    this.placement.place();
    void this.smokes.claim();
    // After a database outage, the pass runs when the database is found back, not up to 5 s later.
    this.stopRetrying = this.health.whenBack(() => void this.placement.place());
  }
  async stopPlacement() {
    clearInterval(this.timer);
    this.schedule?.stop();
    this.stopRetrying?.();
    // The smoke tests are aborted at once; the placement pass running now is waited for.
    const smokes = this.smokes.stop();
    await this.placement.settled();
    await smokes;
  }

  /** Replicas still draining after the last placement pass (drain.ts). */
  draining(): number {
    return this.placement.draining;
  }

  /** See FleetPlacement.place: one pass now, or the one after the pass running. */
  place(): Promise<void> {
    return this.placement.place();
  }
  /** See SmokeTests.due. */
  smokeDue(): Promise<void> {
    return this.smokes.due();
  }
  /** See SmokeTests.smokeReplica (the serve job's smoke step). */
  smokeReplica(...a: Parameters<SmokeTests['smokeReplica']>) {
    return this.smokes.smokeReplica(...a);
  }
  /** What a node's agent should be running or stopping. */
  assignments(nodeId: string) {
    return this.replicas.assignments(nodeId);
  }
  /** See FleetReplicas.reportReplica. */
  reportReplica(actor: Actor, input: unknown) {
    return this.replicas.reportReplica(actor, input);
  }

  /** Seen lately, and not gone since: an agent that said it is stopping is offline at once. */
  isOnline(node: Pick<Node, 'lastSeenAt' | 'leftAt'>, now = this.db.clock.nowMs()) {
    return onlineAt(node, now);
  }

  list() {
    return this.db.node.findMany({ orderBy: { name: 'asc' } });
  }

  async online(now = this.db.clock.nowMs()) {
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
      nodeEngines(n).flatMap((e) =>
        e.name === 'llama.cpp' && e.build !== null ? [{ build: e.build, node: n.name }] : [],
      ),
    );
    if (!builds.length) return { build: fallback, source: 'no node has reported its llama.cpp; assuming' };
    const oldest = builds.reduce((a, b) => (b.build < a.build ? b : a));
    return {
      build: oldest.build,
      source: builds.length > 1 ? `the oldest node (${oldest.node}) runs` : `the nodes run`,
    };
  }

  /**
   * An agent's heartbeat with its inventory. Audited when what the node reports changes (its first report, a
   * GPU or engine added, removed or upgraded), not at every heartbeat, which would bury the log.
   */
  async report(actor: Actor, input: z.input<typeof reportInput>): Promise<Result<Node>> {
    if (actor.viewer.kind !== 'node')
      return fail(new ConflictError('reportNode is for node agents, with their node token'));
    const parsed = parseInput(reportInput, input);
    if (!parsed.ok) return parsed;
    const r = parsed.value;
    const id = actor.viewer.node.id;
    const before = await this.db.node.findUniqueOrThrow({ where: { id } });
    const shape = (gpus: { name: string; totalMiB: number }[], engines: { name: string; build?: number | null }[]) =>
      JSON.stringify([gpus.map((g) => [g.name, g.totalMiB]), engines.map((e) => [e.name, e.build ?? null])]);
    const changed = !before.lastSeenAt || shape(nodeGpus(before), nodeEngines(before)) !== shape(r.gpus, r.engines);
    const node = await this.db.$transaction(async (tx) => {
      const n = await tx.node.update({
        where: { id },
        data: {
          gpus: r.gpus,
          engines: r.engines.map((e) => ({ name: e.name, version: e.version ?? null, build: e.build ?? null })),
          diskFreeBytes: r.diskFreeBytes == null ? null : BigInt(r.diskFreeBytes),
          agentVersion: r.agentVersion ?? null,
          // On the database's clock, as every judgement of it is: a jump of this server's own moves nothing.
          lastSeenAt: this.db.clock.now(),
        },
      });
      if (changed) {
        const gpus = r.gpus.map((g) => `${g.name} ${g.totalMiB} MiB`).join(', ') || 'no GPU';
        const engines = r.engines.map((e) => `${e.name}${e.build ? ` b${e.build}` : ''}`).join(', ') || 'no engine';
        await this.audit.done(tx, actor, { action: 'reportNode', target: n.name, message: `${gpus}; ${engines}` });
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
    actor: Actor,
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
      const held = await tx.replica.findMany({
        where: { nodeId: node.id, state: { in: ['PENDING', 'LOADING', 'READY'] } },
        orderBy: { createdAt: 'asc' },
      });
      // The models' names from the catalog, which owns them.
      const names = await modelNamesByIds(
        tx,
        held.map((r) => r.modelId),
      );
      const replicas = held.map((r) => ({ ...r, model: { name: names.get(r.modelId) ?? r.modelId } }));
      const { running, queued } = await this.train.jobsOnNode(tx, node.id);
      const models = [...new Set(replicas.map((r) => r.model.name))];
      const holds = [
        replicas.length ? `${count(replicas.length, 'replica')} (${models.join(', ')})` : null,
        running.length ? `training job ${running.map((j) => j.name).join(', ')}` : null,
      ].filter(Boolean);
      if (holds.length && !force)
        return fail(
          new ConflictError(
            `node ${name} still runs ${holds.join(' and ')}: stop its agent first (its replicas drain: they finish their requests and are placed on other nodes) and cancel the job, or remove it with force, which cuts the requests in flight there, places its replicas on other nodes and fails the job`,
          ),
        );
      const reason = `node ${name} was removed`;
      await this.train.failNodeJobs(tx, node.id, reason);
      // Its replica rows go with it (their history is in the audit log); the pass places new ones elsewhere.
      await tx.replica.deleteMany({ where: { nodeId: node.id } });
      await tx.node.delete({ where: { id: node.id } });
      // Live connections of its agent end now; its token is looked up on every request, so it is refused at once.
      await notify(tx, 'credentials', `node:${node.id}`);
      const did = [
        replicas.length
          ? `${count(replicas.length, 'replica')} of ${models.join(', ')} deleted, placed again on other nodes`
          : null,
        running.length || queued.length
          ? `training job ${[...running, ...queued].map((j) => j.name).join(', ')} failed ("${reason}")`
          : null,
      ].filter(Boolean);
      const message = `removed node ${name}${did.length ? `: ${did.join('; ')}` : ''}. An agent still running there is refused: stop it`;
      await this.audit.done(tx, actor, { action: 'removeNode', target: name, message });
      return ok({ name, message });
    });
    // In the log too, under the request's id: the refusals its agent meets from now on read as the sequel.
    if (result.ok) {
      if (this.log) logFor(this.log, actor).info('removed a node', { node: name, message: result.value.message });
      void this.place();
    }
    return result;
  }

  /**
   * A new token for a node's agent, shown once; the old one is refused from the moment this commits. Until the
   * agent is started again with the new one it cannot report, and the node goes offline after NODE_ONLINE_MS.
   */
  async rotateNodeToken(actor: Actor, input: { name: string }): Promise<Result<{ node: Node; token: string }>> {
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
      await this.audit.done(tx, actor, {
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
  async revokeNodeToken(actor: Actor, input: { name: string }): Promise<Result<Node>> {
    const parsed = parseInput(z.object({ name: resourceName('a node name') }), input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    const result = await this.db.$transaction(async (tx) => {
      const found = await tx.node.findUnique({ where: { name } });
      if (!found) return fail(new NotFoundError(`no node ${name}: see Nodes for the names`));
      const now = this.db.clock.now();
      // A hash of a secret nobody holds: the column stays unique and non-null, and nothing matches it.
      const node = await tx.node.update({
        where: { id: found.id },
        data: { tokenHash: hashSecret(newSecret('node')), tokenChangedAt: now, tokenRevokedAt: now, leftAt: now },
      });
      await notify(tx, 'credentials', `node:${node.id}`);
      await this.audit.done(tx, actor, {
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
  async leave(actor: Actor): Promise<Result<Node>> {
    if (actor.viewer.kind !== 'node')
      return fail(new ConflictError('leaveNode is for node agents, with their node token'));
    const id = actor.viewer.node.id;
    const node = await this.db.$transaction(async (tx) => {
      // Held off meanwhile, a placement pass sees the node leaving whole: one that read the node still online and
      // then its replicas lost (each read sees what had committed when it ran) placed their replacement right here.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      // Compared with lastSeenAt, so on the same clock.
      const n = await tx.node.update({ where: { id }, data: { leftAt: this.db.clock.now() } });
      // Serving ones drain (drain.ts): the gateway sends them nothing new, the agent finishes their requests and
      // stops each when the placement pass asks, while replacements are placed elsewhere. Loading ones hold none.
      const draining = await tx.replica.updateMany({
        where: { nodeId: id, state: 'READY', desired: 'RUN', drainingSince: null },
        data: {
          drainingSince: this.db.clock.now(),
          message: `draining: node ${n.name} is shutting down; finishing the requests it has`,
        },
      });
      const lost = await tx.replica.updateMany({
        where: { nodeId: id, state: { in: ['LOADING', 'READY'] }, drainingSince: null },
        data: { state: 'LOST', message: `node ${n.name} is shutting down (its agent said so)` },
      });
      await tx.engineKey.deleteMany({ where: { replica: { nodeId: id, state: 'LOST' } } });
      // Placed here but not started: back in line for another node.
      await tx.replica.updateMany({
        where: { nodeId: id, state: 'PENDING' },
        data: { nodeId: null, gpuIndex: null, gpuIndexes: [], message: `node ${n.name} is shutting down` },
      });
      await this.audit.done(tx, actor, {
        action: 'leaveNode',
        target: n.name,
        message: `the agent is stopping${draining.count ? `; ${count(draining.count, 'replica')} draining` : ''}${lost.count + draining.count ? `; ${count(lost.count + draining.count, 'replica')} to place elsewhere` : ''}`,
      });
      await notify(tx, 'trainWork', n.id);
      return n;
    });
    void this.place();
    return ok(node);
  }

  /** Registers a node and returns its agent's token, once: only its hash is kept. */
  async createNode(
    actor: Actor,
    input: z.input<typeof createNodeInput>,
  ): Promise<Result<{ node: Node; token: string }>> {
    const parsed = parseInput(createNodeInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    if (await this.db.node.findUnique({ where: { name } }))
      return fail(new ConflictError(`a node named ${name} already exists`));
    const token = newSecret('node');
    const node = await this.db.$transaction(async (tx) => {
      const n = await tx.node.create({ data: { name, tokenHash: hashSecret(token) } });
      await this.audit.done(tx, actor, { action: 'createNode', target: name });
      return n;
    });
    return ok({ node, token });
  }
}
