import type { CatalogModel, Node, Replica } from '../generated/prisma/client.js';
import { freeMiB, nodeGpus, runsEngine } from './node-inventory.js';

// Where replicas go, as a pure decision over what the database says: which models want how many replicas, which
// nodes are online with how much free GPU memory, and which replicas exist. The pass (fleet-placement.ts) applies it.

export type PlacementModel = Pick<
  CatalogModel,
  'id' | 'name' | 'engine' | 'memoryBytes' | 'minReplicas' | 'maxReplicas' | 'awakeUntil'
>;
export type PlacementNode = Pick<Node, 'id' | 'name' | 'gpus' | 'engines'> & { online: boolean };
export type PlacementReplica = Pick<Replica, 'id' | 'modelId' | 'nodeId' | 'state' | 'desired' | 'createdAt'> & {
  updatedAt?: Date;
  gpuIndex?: number | null;
};

export type Actions = {
  /** `gpuIndex` absent: the node as a whole (it reports no GPU, or the model fits only split across its GPUs). */
  place: { modelId: string; nodeId: string | null; message: string | null; replicaId?: string; gpuIndex?: number }[];
  stop: string[];
  lost: { replicaId: string; message: string }[];
  /**
   * Replicas asked to stop whose agent has not stopped them yet, wanted again (a wake right after the idle timer
   * ran out): asked to run on, warm, rather than stopped and replaced by a cold one.
   */
  keep: string[];
};

const ACTIVE = new Set(['PENDING', 'LOADING', 'READY']);
const MiB = 2 ** 20;

/** How many replicas a model wants now: ALWAYS its count, ON_DEMAND one while woken, STOPPED none. */
export function wanted(m: Pick<PlacementModel, 'minReplicas' | 'maxReplicas' | 'awakeUntil'>, now: Date): number {
  if (m.maxReplicas === 0) return 0;
  if (m.minReplicas === 0) return m.awakeUntil && m.awakeUntil > now ? 1 : 0;
  return m.minReplicas;
}

const engineName = (e: PlacementModel['engine']) => (e === 'llamacpp' ? 'llama.cpp' : 'vllm');

export function decide(
  models: PlacementModel[],
  nodes: PlacementNode[],
  replicas: PlacementReplica[],
  now = new Date(),
): Actions {
  const actions: Actions = { place: [], stop: [], lost: [], keep: [] };
  const byId = new Map(nodes.map((n) => [n.id, n]));
  // Memory already promised to replicas still loading (not yet in the agent's own free figures): on each node,
  // and on each GPU for those placed on one (keyed node:index).
  const promised = new Map<string, number>();
  const promise = (nodeId: string, gpuIndex: number | null | undefined, mib: number) => {
    promised.set(nodeId, (promised.get(nodeId) ?? 0) + mib);
    if (gpuIndex != null) promised.set(`${nodeId}:${gpuIndex}`, (promised.get(`${nodeId}:${gpuIndex}`) ?? 0) + mib);
  };
  const modelById = new Map(models.map((m) => [m.id, m]));
  for (const r of replicas) {
    if (r.nodeId && (r.state === 'PENDING' || r.state === 'LOADING') && r.desired === 'RUN') {
      promise(r.nodeId, r.gpuIndex, Number(modelById.get(r.modelId)?.memoryBytes ?? 0n) / MiB);
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
    // Wanted again before its agent stopped it: it runs on (READY first, then the newest), and counts as active.
    const stopping = mine
      .filter(
        (r) =>
          r.desired === 'STOP' &&
          (r.state === 'READY' || r.state === 'LOADING') &&
          r.nodeId &&
          byId.get(r.nodeId)?.online &&
          !lostIds.has(r.id),
      )
      .sort((a, b) =>
        a.state === b.state ? b.createdAt.getTime() - a.createdAt.getTime() : a.state === 'READY' ? -1 : 1,
      );
    for (const r of stopping.slice(0, Math.max(0, want - active.length))) {
      actions.keep.push(r.id);
      active.push(r);
    }

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
    // Where this model already runs: a GPU holds one replica of it, a node taken as a whole holds one.
    const usedGpus = new Set(active.filter((r) => r.gpuIndex != null).map((r) => `${r.nodeId}:${r.gpuIndex}`));
    const wholeNode = new Set(active.filter((r) => r.nodeId && r.gpuIndex == null).map((r) => r.nodeId));
    const holds = new Set(active.map((r) => r.nodeId).filter(Boolean));
    const choose = (): { node: PlacementNode | null; gpuIndex?: number; message: string | null } => {
      const eligible = nodes.filter(
        (n) => n.online && runsEngine(n, engine) && !failedOn.has(n.id) && !wholeNode.has(n.id),
      );
      const nodeFree = (n: PlacementNode) => freeMiB(n) - (promised.get(n.id) ?? 0);
      // One replica per GPU that holds it alone; a node with several such GPUs takes several. A node that does
      // not yet hold the model comes first: two copies on two machines outlive one machine going down.
      const perGpu = eligible.flatMap((n) =>
        nodeGpus(n)
          .filter((g) => !usedGpus.has(`${n.id}:${g.index}`))
          .map((g) => ({
            n,
            gpuIndex: g.index as number | undefined,
            free: Math.min(g.freeMiB - (promised.get(`${n.id}:${g.index}`) ?? 0), nodeFree(n)),
          })),
      );
      // Else the node as a whole (llama.cpp splits a model across its GPUs; a node with no GPU runs on its CPU),
      // once per node.
      const whole = eligible
        .filter((n) => !holds.has(n.id))
        .map((n) => ({ n, gpuIndex: undefined, free: nodeFree(n) }));
      const order = (a: { n: PlacementNode; free: number }, b: { n: PlacementNode; free: number }) =>
        Number(holds.has(a.n.id)) - Number(holds.has(b.n.id)) || b.free - a.free;
      const fitting =
        perGpu.filter((c) => c.free >= neededMiB).sort(order)[0] ??
        whole.filter((c) => c.free >= neededMiB).sort(order)[0];
      if (fitting) return { node: fitting.n, gpuIndex: fitting.gpuIndex, message: null };
      const candidates = whole.length ? whole : perGpu;
      const online = nodes.filter((n) => n.online);
      if (!online.length) return { node: null, message: 'no node is online' };
      if (!online.some((n) => runsEngine(n, engine))) return { node: null, message: `no online node runs ${engine}` };
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
    // Unplaced replicas first (they keep their place in line), then new ones. A replica placed on a node that went
    // offline before its agent took it up is unplaced again: nobody would ever start it there.
    const unplaced = active
      .filter((r) => r.state === 'PENDING' && !(r.nodeId && byId.get(r.nodeId)?.online))
      .slice(0, want);
    let count = Math.min(active.length, want);
    const taken = (c: ReturnType<typeof choose>) => {
      if (!c.node) return;
      holds.add(c.node.id);
      if (c.gpuIndex === undefined) wholeNode.add(c.node.id);
      else usedGpus.add(`${c.node.id}:${c.gpuIndex}`);
      promise(c.node.id, c.gpuIndex, neededMiB);
    };
    const placed = (c: ReturnType<typeof choose>) => (c.gpuIndex === undefined ? {} : { gpuIndex: c.gpuIndex });
    for (const r of unplaced) {
      const c = choose();
      actions.place.push({
        modelId: m.id,
        nodeId: c.node?.id ?? null,
        message: c.message,
        replicaId: r.id,
        ...placed(c),
      });
      taken(c);
    }
    for (; count < want; count++) {
      const c = choose();
      actions.place.push({ modelId: m.id, nodeId: c.node?.id ?? null, message: c.message, ...placed(c) });
      if (c.node) taken(c);
      else break; // one pending replica says why; more would only repeat it
    }
  }
  return actions;
}

function gib(mib: number) {
  return `${(mib / 1024).toFixed(1)} GiB`;
}
