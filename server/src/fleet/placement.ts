import type { CatalogModel, Node, Replica } from '../generated/prisma/client.js';
import { type Card, GpuLedger, type GpuMargin, gib, type RoomReplica, roomMiB, roomWords } from './gpu-room.js';
import { noGpuReason, runsEngine } from './node-inventory.js';

// Where replicas go, as a pure decision over what the database says: which models want how many replicas, which
// nodes are online with how much free GPU memory, and which replicas exist. The pass (fleet-placement.ts) applies it.

export type PlacementModel = Pick<
  CatalogModel,
  'id' | 'name' | 'engine' | 'memoryBytes' | 'minReplicas' | 'maxReplicas' | 'awakeUntil'
> & {
  /** The count the autoscaler chose (scaling.ts), for a model with a target; kept within min (or awake) and max. */
  scaledReplicas?: number | null;
};
export type PlacementNode = Pick<Node, 'id' | 'name' | 'gpus' | 'engines'> & { online: boolean };
export type PlacementReplica = Pick<Replica, 'id' | 'modelId' | 'nodeId' | 'state' | 'desired' | 'createdAt'> &
  Omit<RoomReplica, 'modelId' | 'nodeId' | 'state' | 'gpuIndex'> & {
    updatedAt?: Date;
    gpuIndex?: number | null;
  };

export type Actions = {
  /**
   * `gpuIndex`: the one card it goes on; `gpuIndexes`: the cards of one node a model too large for one card is
   * split across; neither: the node as a whole (it reports no GPU).
   */
  place: {
    modelId: string;
    nodeId: string | null;
    message: string | null;
    replicaId?: string;
    gpuIndex?: number;
    gpuIndexes?: number[];
  }[];
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

export type DecideOptions = {
  /** HANGAR_GPU_MEMORY_MARGIN: what each card keeps unbooked (default 10 %). */
  margin?: GpuMargin;
};

/**
 * How many replicas a model wants now: ALWAYS its count, ON_DEMAND one while woken, STOPPED none; an autoscaled
 * model what its load asked for, within those bounds.
 */
export function wanted(
  m: Pick<PlacementModel, 'minReplicas' | 'maxReplicas' | 'awakeUntil' | 'scaledReplicas'>,
  now: Date,
): number {
  if (m.maxReplicas === 0) return 0;
  const floor = m.minReplicas === 0 ? (m.awakeUntil && m.awakeUntil > now ? 1 : 0) : m.minReplicas;
  // Autoscaled: as many as the load asked for, never under the floor (asleep stays asleep) nor over max.
  if (floor > 0 && m.scaledReplicas != null) return Math.min(m.maxReplicas, Math.max(floor, m.scaledReplicas));
  return floor;
}

const engineName = (e: PlacementModel['engine']) => (e === 'llamacpp' ? 'llama.cpp' : 'vllm');

export function decide(
  models: PlacementModel[],
  nodes: PlacementNode[],
  replicas: PlacementReplica[],
  now = new Date(),
  o: DecideOptions = {},
): Actions {
  const actions: Actions = { place: [], stop: [], lost: [], keep: [] };
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const modelById = new Map(models.map((m) => [m.id, m]));
  // What every card holds (measured once loaded, planned before) and has room for; each replica placed below is
  // booked on it at once, so one pass never promises a card twice.
  const ledger = new GpuLedger(nodes, replicas, (id) => modelById.get(id)?.memoryBytes, o.margin);

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
    // A node that reports no GPU is taken as a whole (it runs on its CPU), once; a card holds as many replicas as
    // its room allows, of this model or others.
    const wholeNode = new Set(
      active.filter((r) => r.nodeId && r.gpuIndex == null && !r.gpuIndexes?.length).map((r) => r.nodeId),
    );
    const holds = new Set(active.map((r) => r.nodeId).filter(Boolean));
    type Option = { n: PlacementNode; gpus: number[]; room: number; here: number; card?: Card };
    const choose = (): { node: PlacementNode | null; gpus: number[]; message: string | null } => {
      const eligible = nodes.filter((n) => n.online && runsEngine(n, engine) && !failedOn.has(n.id));
      const single: Option[] = [];
      const split: Option[] = [];
      const whole: Option[] = [];
      for (const n of eligible) {
        const cards = ledger.of(n.id);
        if (!cards.length) {
          if (!wholeNode.has(n.id)) whole.push({ n, gpus: [], room: 0, here: 0 });
          continue;
        }
        for (const c of cards)
          single.push({ n, gpus: [c.index], room: roomMiB(c), here: c.models.get(m.id) ?? 0, card: c });
        // Too large for one card: split over the k roomiest cards of one node, an equal share on each (vLLM's
        // tensor parallelism shards evenly, and llama.cpp is told the same split), so the k-th must hold its share.
        // vLLM splits only over 2, 4 or 8 cards: attention heads divide by those, not by 3.
        const byRoom = [...cards].sort((a, b) => roomMiB(b) - roomMiB(a));
        for (let k = 2; k <= byRoom.length; k++) {
          if (m.engine === 'vllm' && ![2, 4, 8].includes(k)) continue;
          const gpus = byRoom.slice(0, k).map((c) => c.index);
          split.push({ n, gpus: gpus.sort((a, b) => a - b), room: roomMiB(byRoom[k - 1] as Card) * k, here: 0 });
        }
      }
      // A node that does not yet hold the model comes first (two copies on two machines outlive one machine going
      // down), then a card that does not, then the most room.
      const order = (a: Option, b: Option) =>
        Number(holds.has(a.n.id)) - Number(holds.has(b.n.id)) || a.here - b.here || b.room - a.room;
      const fitting =
        single.filter((c) => c.room >= neededMiB).sort(order)[0] ??
        split.filter((c) => c.room >= neededMiB).sort((a, b) => a.gpus.length - b.gpus.length || order(a, b))[0] ??
        whole.filter((c) => c.room >= neededMiB).sort(order)[0];
      if (fitting) return { node: fitting.n, gpus: fitting.gpus, message: null };
      const online = nodes.filter((n) => n.online);
      if (!online.length) return { node: null, gpus: [], message: 'no node is online' };
      if (!online.some((n) => runsEngine(n, engine)))
        return { node: null, gpus: [], message: `no online node runs ${engine}` };
      const best = single.sort((a, b) => b.room - a.room)[0];
      if (!best) {
        const bare = whole[0];
        return {
          node: null,
          gpus: [],
          message: bare
            ? `fits on no node: ${noGpuReason(bare.n.name, neededMiB)}`
            : `every node that runs ${engine} already has a replica of ${m.name} or failed to load it lately`,
        };
      }
      const most = split.sort((a, b) => b.room - a.room)[0];
      const together =
        most && most.room > best.room
          ? `; split over ${most.gpus.length} cards of ${most.n.name}, ${gib(Math.max(0, most.room))}`
          : '';
      return {
        node: null,
        gpus: [],
        message: `fits on no node: needs ${gib(neededMiB)}, the most room is ${roomWords(best.card as Card)}${together}. It is placed once a card (or the cards of one node together) has that room: when a replica there stops, a node with more GPU memory joins, or HANGAR_GPU_MEMORY_MARGIN is lowered`,
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
      if (!c.gpus.length) wholeNode.add(c.node.id);
      else ledger.book(c.node.id, c.gpus, neededMiB, m.id);
    };
    const placed = (c: ReturnType<typeof choose>) =>
      c.gpus.length === 1 ? { gpuIndex: c.gpus[0] } : c.gpus.length > 1 ? { gpuIndexes: c.gpus } : {};
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
