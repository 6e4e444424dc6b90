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
