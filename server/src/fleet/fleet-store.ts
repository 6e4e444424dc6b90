import type { Db, Tx } from '../db/client.js';

// Nodes and replicas belong to fleet (db/owners.ts). Other domains read them only through these functions, so
// test/table-owners.test.ts can hold every other folder to that and a change to their columns is made here once.
// Each takes the client to use: a caller's transaction when the answer must hold for what it writes, the
// requests' or loops' client otherwise.

type Client = Db | Tx;

/** The node a node secret (hgn_…) belongs to, by the secret's hash: how an agent is identified. */
export function nodeByTokenHash(db: Client, tokenHash: string) {
  return db.node.findUnique({ where: { tokenHash }, select: { id: true, name: true } });
}

/** A node by id. */
export function nodeById(db: Client, id: string) {
  return db.node.findUnique({ where: { id } });
}

/** A node by its name, as an operator types it. */
export function nodeByName(db: Client, name: string) {
  return db.node.findUnique({ where: { name } });
}

/** How many replicas of a model are wanted running and are loading or serving now. */
export function runningReplicas(db: Client, modelId: string): Promise<number> {
  return db.replica.count({ where: { modelId, desired: 'RUN', state: { in: ['LOADING', 'READY'] } } });
}

/** Whether a node holds a replica of a model (in any state): it may then read that model's files. */
export async function runsModel(db: Client, nodeId: string, modelId: string): Promise<boolean> {
  return (await db.replica.count({ where: { nodeId, modelId } })) > 0;
}

/** A model's replicas with the node each is placed on (none while pending): a serve job watches them start. */
export function replicasOfModel(db: Client, modelId: string) {
  return db.replica.findMany({ where: { modelId }, include: { node: true } });
}

/**
 * The fleet's half of the gateway's route table: every replica wanted running and not yet gone, and those that
 * failed since `failedSince` (why nothing serves a model), newest first, with their node's name and engine key;
 * with `modelIds`, those of these models only (the route table reads a model again when its event comes).
 */
export function routingReplicas(db: Client, failedSince: Date, modelIds?: readonly string[]) {
  return db.replica.findMany({
    where: {
      ...(modelIds ? { modelId: { in: [...modelIds] } } : {}),
      OR: [
        // A draining replica (fleet/drain.ts) finishes what it has and is sent nothing new.
        { desired: 'RUN', drainingSince: null, state: { in: ['PENDING', 'LOADING', 'READY'] } },
        { state: 'FAILED', updatedAt: { gt: failedSince } },
      ],
    },
    include: { node: { select: { name: true } }, engineKey: { select: { key: true } } },
    orderBy: { updatedAt: 'desc' },
  });
}

/** Nodes by id, in one query, keyed by id (a node removed since is missing). */
export async function nodesByIds(db: Client, ids: string[]) {
  const nodes = ids.length ? await db.node.findMany({ where: { id: { in: [...new Set(ids)] } } }) : [];
  return new Map(nodes.map((n) => [n.id, n]));
}

/** A model's serving replicas that take requests (READY, wanted, not draining), by model id: the autoscaler's count. */
export async function readyReplicaCounts(db: Client): Promise<Map<string, number>> {
  const rows = await db.replica.groupBy({
    by: ['modelId'],
    where: { state: 'READY', desired: 'RUN', drainingSince: null },
    _count: { _all: true },
  });
  return new Map(rows.map((r) => [r.modelId, r._count._all]));
}
