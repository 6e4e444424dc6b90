import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { hashSecret, newSecret } from '../auth/secrets.js';
import type { Context } from '../context.js';
import type { Db } from '../db/client.js';
import type { Node } from '../generated/prisma/client.js';
import { ConflictError, fail, ok, type Result } from '../lib/errors.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';

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

export class FleetService {
  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
  ) {}

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
  async llamaCppBuild(fallback: number): Promise<{ build: number; source: string }> {
    const builds = (await this.online()).flatMap((n) =>
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
