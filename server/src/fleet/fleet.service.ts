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
