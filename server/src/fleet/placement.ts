import type { CatalogModel, Node, Replica } from '../generated/prisma/client.js';

// Where replicas go, as a pure decision over what the database says: which models want how many replicas, which
// nodes are online with how much free GPU memory, and which replicas exist. The pass (fleet.service.ts) applies it.

export type PlacementModel = Pick<
  CatalogModel,
  'id' | 'name' | 'engine' | 'memoryBytes' | 'minReplicas' | 'maxReplicas' | 'awakeUntil'
>;
export type PlacementNode = Pick<Node, 'id' | 'name' | 'gpus' | 'engines'> & { online: boolean };
export type PlacementReplica = Pick<Replica, 'id' | 'modelId' | 'nodeId' | 'state' | 'desired' | 'createdAt'> & {
  updatedAt?: Date;
};

export type Actions = {
  place: { modelId: string; nodeId: string | null; message: string | null; replicaId?: string }[];
  stop: string[];
  lost: { replicaId: string; message: string }[];
};

const ACTIVE = new Set(['PENDING', 'LOADING', 'READY']);
const MiB = 2 ** 20;

/** How many replicas a model wants now: ALWAYS its count, ON_DEMAND one while woken, STOPPED none. */
export function wanted(m: PlacementModel, now: Date): number {
  if (m.maxReplicas === 0) return 0;
  if (m.minReplicas === 0) return m.awakeUntil && m.awakeUntil > now ? 1 : 0;
  return m.minReplicas;
}

const engineName = (e: PlacementModel['engine']) => (e === 'llamacpp' ? 'llama.cpp' : 'vllm');
/** A node's free GPU memory as its agent last reported it, summed over its GPUs (llama.cpp can split a model). */
export const freeMiB = (n: Pick<Node, 'gpus'>) =>
  (Array.isArray(n.gpus) ? (n.gpus as { freeMiB?: number }[]) : []).reduce((s, g) => s + (g.freeMiB ?? 0), 0);
const runs = (n: PlacementNode, engine: string) =>
  Array.isArray(n.engines) && (n.engines as { name?: string }[]).some((e) => e.name === engine);

export function decide(
  models: PlacementModel[],
  nodes: PlacementNode[],
  replicas: PlacementReplica[],
  now = new Date(),
): Actions {
  const actions: Actions = { place: [], stop: [], lost: [] };
  const byId = new Map(nodes.map((n) => [n.id, n]));
  // Memory already promised on each node to replicas still loading (not yet in the node's own free figure).
  const promised = new Map<string, number>();
  const modelById = new Map(models.map((m) => [m.id, m]));
  for (const r of replicas) {
    if (r.nodeId && (r.state === 'PENDING' || r.state === 'LOADING') && r.desired === 'RUN') {
      const need = Number(modelById.get(r.modelId)?.memoryBytes ?? 0n) / MiB;
      promised.set(r.nodeId, (promised.get(r.nodeId) ?? 0) + need);
    }
  }

  for (const m of models) {
    const mine = replicas.filter((r) => r.modelId === m.id);
    // A node that vanished takes its replicas with it: shown as lost, and replaced elsewhere.
    for (const r of mine) {
      const node = r.nodeId ? byId.get(r.nodeId) : undefined;
      if (r.nodeId && ACTIVE.has(r.state) && r.state !== 'PENDING' && !node?.online) {
        actions.lost.push({ replicaId: r.id, message: `node ${node?.name ?? 'unknown'} stopped reporting` });
      }
    }
    const lostIds = new Set(actions.lost.map((l) => l.replicaId));
    const active = mine
      .filter((r) => r.desired === 'RUN' && ACTIVE.has(r.state) && !lostIds.has(r.id))
      .sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
    const want = wanted(m, now);
    for (const extra of active.slice(want)) actions.stop.push(extra.id);

    const neededMiB = Math.ceil(Number(m.memoryBytes ?? 0n) / MiB);
    const engine = engineName(m.engine);
    // Nodes where this model failed lately are skipped: a file that does not load would fail again there. So is a
    // node whose agent stopped a replica nobody asked to stop: it is shutting down, though still counted online.
    const since = (r: PlacementReplica) => now.getTime() - (r.updatedAt ?? r.createdAt).getTime();
    const failedOn = new Set(
      mine
        .filter(
          (r) =>
            r.nodeId &&
            ((r.state === 'FAILED' && since(r) < 5 * 60_000) ||
              (r.state === 'STOPPED' && r.desired === 'RUN' && since(r) < 60_000)),
        )
        .map((r) => r.nodeId),
    );
    const used = new Set(active.map((r) => r.nodeId).filter(Boolean));
    const choose = () => {
      const candidates = nodes
        .filter((n) => n.online && runs(n, engine) && !failedOn.has(n.id) && !used.has(n.id))
        .map((n) => ({ n, free: freeMiB(n) - (promised.get(n.id) ?? 0) }));
      const fitting = candidates.filter((c) => c.free >= neededMiB).sort((a, b) => b.free - a.free);
      if (fitting[0]) return { node: fitting[0].n, message: null };
      const online = nodes.filter((n) => n.online);
      if (!online.length) return { node: null, message: 'no node is online' };
      if (!online.some((n) => runs(n, engine))) return { node: null, message: `no online node runs ${engine}` };
      const best = candidates.sort((a, b) => b.free - a.free)[0];
      if (!best)
        return {
          node: null,
          message: `every node that runs ${engine} already has a replica of ${m.name} or failed to load it lately`,
        };
      return {
        node: null,
        message: `fits on no node: needs ${gib(neededMiB)}, the most free is ${gib(Math.max(0, best.free))} on ${best.n.name}`,
      };
    };
    // Unplaced replicas first (they keep their place in line), then new ones.
    const unplaced = active.filter((r) => r.state === 'PENDING' && !r.nodeId).slice(0, want);
    let count = Math.min(active.length, want);
    for (const r of unplaced) {
      const c = choose();
      actions.place.push({ modelId: m.id, nodeId: c.node?.id ?? null, message: c.message, replicaId: r.id });
      if (c.node) {
        used.add(c.node.id);
        promised.set(c.node.id, (promised.get(c.node.id) ?? 0) + neededMiB);
      }
    }
    for (; count < want; count++) {
      const c = choose();
      actions.place.push({ modelId: m.id, nodeId: c.node?.id ?? null, message: c.message });
      if (c.node) {
        used.add(c.node.id);
        promised.set(c.node.id, (promised.get(c.node.id) ?? 0) + neededMiB);
      } else break; // one pending replica says why; more would only repeat it
    }
  }
  return actions;
}

function gib(mib: number) {
  return `${(mib / 1024).toFixed(1)} GiB`;
}
