import type { Node } from '../generated/prisma/client.js';

// A node's inventory as its agent last reported it (reportNode). The GPUs and engines are JSON columns, so the
// database promises nothing of their shape: every reader in Hangar goes through here instead of casting. Rows
// written before reports were checked (and tests' seeds) may lack a figure: a GPU without an index is numbered by
// its place in the report, as the agent numbers them; a missing figure reads as 0, a missing name as "GPU"; an
// engine without a name is left out, since nothing could ask for it.

export type NodeGpu = { index: number; name: string; totalMiB: number; freeMiB: number };
export type NodeEngine = { name: string; version: string | null; build: number | null };

type Field = Record<string, unknown>;
const fields = (v: unknown): Field => (typeof v === 'object' && v !== null ? (v as Field) : {});
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);
const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

/** The node's GPUs, in the order its agent reported them. */
export function nodeGpus(node: Pick<Node, 'gpus'>): NodeGpu[] {
  if (!Array.isArray(node.gpus)) return [];
  return node.gpus.map((raw, i) => {
    const g = fields(raw);
    return {
      index: num(g.index) ?? i,
      name: str(g.name) ?? 'GPU',
      totalMiB: num(g.totalMiB) ?? 0,
      freeMiB: num(g.freeMiB) ?? 0,
    };
  });
}

/** The engines the node's agent can run (llama.cpp, vLLM), with llama.cpp's build where it said one. */
export function nodeEngines(node: Pick<Node, 'engines'>): NodeEngine[] {
  if (!Array.isArray(node.engines)) return [];
  return node.engines.flatMap((raw) => {
    const e = fields(raw);
    const name = str(e.name);
    return name === undefined ? [] : [{ name, version: str(e.version) ?? null, build: num(e.build) ?? null }];
  });
}

/** Whether the node's agent reported this engine ("llama.cpp", "vllm"). */
export function runsEngine(node: Pick<Node, 'engines'>, engine: string): boolean {
  return nodeEngines(node).some((e) => e.name === engine);
}

/**
 * The node's free GPU memory summed over its GPUs: what a model may use there, since llama.cpp splits one across
 * cards. A training job needs its memory on one card: that is largestFreeMiB.
 */
export function freeMiB(node: Pick<Node, 'gpus'>): number {
  return nodeGpus(node).reduce((sum, g) => sum + g.freeMiB, 0);
}

/** The most free memory on one of the node's GPUs (a training job runs on one card); 0 with none reported. */
export function largestFreeMiB(node: Pick<Node, 'gpus'>): number {
  return nodeGpus(node).reduce((most, g) => Math.max(most, g.freeMiB), 0);
}

/** The node's card with the most memory in all (free or not), the first of equals; null before it reported one. */
export function largestCard(node: Pick<Node, 'gpus'>): NodeGpu | null {
  return nodeGpus(node).reduce<NodeGpu | null>((best, g) => (!best || g.totalMiB > best.totalMiB ? g : best), null);
}

/**
 * Why a node with no GPU in its report holds no model, and what to do: "needs 514 MiB, 0 MiB free" alone reads as a
 * full GPU. The agent reports what nvidia-smi finds, else HANGAR_AGENT_GPUS; a machine without one serves on its
 * CPU once the memory it may use is declared there (with HANGAR_AGENT_GPU=false llama.cpp keeps to the CPU).
 */
export function noGpuReason(nodeName: string, neededMiB: number): string {
  return `needs ${neededMiB} MiB, and ${nodeName} reported no GPU (nvidia-smi found none and HANGAR_AGENT_GPUS is unset on its agent): declare its GPU with HANGAR_AGENT_GPUS='[{"name":"RTX 4090","totalMiB":24564}]', or serve on the CPU by declaring the memory the model may use there the same way and setting HANGAR_AGENT_GPU=false`;
}
