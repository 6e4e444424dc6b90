import type { Node, Replica } from '../generated/prisma/client.js';
import { nodeGpus } from './node-inventory.js';

// What each GPU of the fleet holds and has room for, as placement books it: a card holds as many replicas as its
// memory allows. A replica counts what its agent measured once it is loaded (vramUsedBytes) and its model's
// planned memory before that, so a card is never promised twice while a load is still under way; what the card
// reports in use beyond Hangar's loaded replicas (another program, a driver) is kept off too, and so is a margin
// (HANGAR_GPU_MEMORY_MARGIN) for the estimate's error and the engine's own buffers.

/** HANGAR_GPU_MEMORY_MARGIN: a share of each card, or a size in MiB. */
export type GpuMargin = { percent: number } | { mib: number };
export const DEFAULT_GPU_MARGIN: GpuMargin = { percent: 10 };

const MiB = 2 ** 20;

/** The MiB a card of `totalMiB` keeps unbooked. */
export function marginMiB(margin: GpuMargin, totalMiB: number): number {
  return 'percent' in margin ? Math.ceil((totalMiB * margin.percent) / 100) : Math.min(Math.ceil(margin.mib), totalMiB);
}

export type RoomNode = Pick<Node, 'id' | 'name' | 'gpus'>;
export type RoomReplica = Pick<Replica, 'modelId' | 'nodeId' | 'state'> & {
  gpuIndex?: number | null;
  gpuIndexes?: number[];
  servingAt?: Date | null;
  vramUsedBytes?: bigint | null;
  gpuLayers?: number | null;
};

export type Card = {
  nodeId: string;
  nodeName: string;
  index: number;
  totalMiB: number;
  marginMiB: number;
  /** Booked by Hangar's replicas on it: measured once loaded, planned before. */
  heldMiB: number;
  /** In use on the card by anything else, as its last report shows. */
  othersMiB: number;
  /** Replicas on it, and of which models (a card holding a model comes after one that does not). */
  replicas: number;
  models: Map<string, number>;
};

/** What a card has left for one more replica. */
export const roomMiB = (c: Card) => c.totalMiB - c.marginMiB - c.othersMiB - c.heldMiB;

/** The cards a replica sits on: its split, its one card, or (placed on the node as a whole) all of them. */
export function cardsOf(r: Pick<RoomReplica, 'gpuIndex' | 'gpuIndexes'>, node: Pick<Node, 'gpus'>): number[] {
  if (r.gpuIndexes?.length) return r.gpuIndexes;
  if (r.gpuIndex != null) return [r.gpuIndex];
  return nodeGpus(node).map((g) => g.index);
}

/**
 * What a replica holds on its node's GPUs, in MiB over all its cards: the agent's measurement once it has loaded
 * with layers on a GPU, else the plan. A measurement with no layer on a GPU is llama.cpp's CPU build, which says
 * nothing of the card: the replica is booked at the plan until it loads on one.
 */
export function heldByReplica(
  r: RoomReplica,
  plannedBytes: bigint | null | undefined,
): { mib: number; measured: boolean } {
  const loaded = r.state === 'READY' || r.servingAt != null;
  if (loaded && r.vramUsedBytes != null && (r.gpuLayers ?? 0) > 0)
    return { mib: Number(r.vramUsedBytes) / MiB, measured: true };
  return { mib: Number(plannedBytes ?? 0n) / MiB, measured: false };
}

/**
 * The share of each of its cards a replica was booked, as vLLM's --gpu-memory-utilization takes it (0.01 to
 * 0.95): vLLM otherwise takes 90 % of every card it sees, and a second replica on the card would not start.
 * Null when it sits on no card of its own (the node as a whole) or its plan says no size.
 */
export function bookedShare(
  r: Pick<RoomReplica, 'gpuIndex' | 'gpuIndexes'>,
  node: Pick<Node, 'gpus'> | null,
  plannedBytes: bigint | null | undefined,
): number | null {
  const indexes = r.gpuIndexes?.length ? r.gpuIndexes : r.gpuIndex != null ? [r.gpuIndex] : [];
  if (!node || !indexes.length || !plannedBytes) return null;
  const totals = nodeGpus(node)
    .filter((g) => indexes.includes(g.index))
    .map((g) => g.totalMiB);
  const smallest = Math.min(...totals);
  if (!totals.length || !(smallest > 0)) return null;
  const share = Number(plannedBytes) / MiB / indexes.length / smallest;
  return Math.min(0.95, Math.max(0.01, Math.ceil(share * 100) / 100));
}

const HOLDING = new Set(['PENDING', 'LOADING', 'READY']);

/**
 * Every card of the given nodes, with what the replicas placed there hold. A replica asked to stop still holds
 * its memory until its agent has stopped it, so it is counted until then.
 */
export class GpuLedger {
  private readonly cards = new Map<string, Card>();
  private readonly byNode = new Map<string, Card[]>();

  constructor(
    nodes: RoomNode[],
    replicas: RoomReplica[],
    plannedBytes: (modelId: string) => bigint | null | undefined,
    margin: GpuMargin = DEFAULT_GPU_MARGIN,
  ) {
    const free = new Map<string, number>();
    for (const n of nodes) {
      const list = nodeGpus(n).map((g) => {
        // A report without a total (rows from before it was sent) counts its free memory as the card.
        const totalMiB = Math.max(g.totalMiB, g.freeMiB);
        const card: Card = {
          nodeId: n.id,
          nodeName: n.name,
          index: g.index,
          totalMiB,
          marginMiB: marginMiB(margin, totalMiB),
          heldMiB: 0,
          othersMiB: 0,
          replicas: 0,
          models: new Map(),
        };
        this.cards.set(`${n.id}:${g.index}`, card);
        free.set(`${n.id}:${g.index}`, g.freeMiB);
        return card;
      });
      this.byNode.set(n.id, list);
    }
    // Memory the card's report shows in use that Hangar's loaded replicas do not explain: another program's.
    const loadedOn = new Map<string, number>();
    const nodeById = new Map(nodes.map((n) => [n.id, n]));
    for (const r of replicas) {
      const node = r.nodeId ? nodeById.get(r.nodeId) : undefined;
      if (!node || !HOLDING.has(r.state)) continue;
      const indexes = cardsOf(r, node);
      const held = heldByReplica(r, plannedBytes(r.modelId)).mib;
      this.book(node.id, indexes, held, r.modelId);
      if (r.state === 'READY' || r.servingAt != null)
        for (const i of indexes)
          loadedOn.set(`${node.id}:${i}`, (loadedOn.get(`${node.id}:${i}`) ?? 0) + held / indexes.length);
    }
    for (const [key, card] of this.cards) {
      const used = card.totalMiB - (free.get(key) ?? 0);
      card.othersMiB = Math.max(0, used - (loadedOn.get(key) ?? 0));
    }
  }

  /** The node's cards, in the order its agent reported them. */
  of(nodeId: string): Card[] {
    return this.byNode.get(nodeId) ?? [];
  }

  /** Books `mib` on the node's cards, an equal share on each (a split replica's layers are spread evenly). */
  book(nodeId: string, indexes: number[], mib: number, modelId: string) {
    for (const i of indexes) {
      const card = this.cards.get(`${nodeId}:${i}`);
      if (!card) continue;
      card.heldMiB += mib / indexes.length;
      card.replicas++;
      card.models.set(modelId, (card.models.get(modelId) ?? 0) + 1);
    }
  }
}

/** "24.0 GiB" */
export function gib(mib: number) {
  return `${(mib / 1024).toFixed(1)} GiB`;
}

/**
 * A card's room in words, with what takes the rest: "5.1 GiB on gpu-2 GPU 0 (of 24.0 GiB: 16.0 GiB held by 2
 * replicas, 2.4 GiB kept free by HANGAR_GPU_MEMORY_MARGIN)".
 */
export function roomWords(c: Card): string {
  const taken = [
    c.heldMiB > 0 ? `${gib(c.heldMiB)} held by ${c.replicas} replica${c.replicas === 1 ? '' : 's'}` : null,
    c.othersMiB > 0 ? `${gib(c.othersMiB)} in use outside Hangar` : null,
    c.marginMiB > 0 ? `${gib(c.marginMiB)} kept free by HANGAR_GPU_MEMORY_MARGIN` : null,
  ].filter(Boolean);
  return `${gib(Math.max(0, roomMiB(c)))} on ${c.nodeName} GPU ${c.index} (of ${gib(c.totalMiB)}${taken.length ? `: ${taken.join(', ')}` : ''})`;
}
