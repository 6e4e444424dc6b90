import type { MemoryEstimate } from '../gguf/memory.js';
import type { Verdict } from '../gguf/verdict.js';
import table from './text-generation-architectures.json' with { type: 'json' };

// Safetensors sets are served by vLLM, which reads the repository's config.json, not a GGUF header. What vLLM
// can load is its model registry (`_TEXT_GENERATION_MODELS`, copied with its commit into
// text-generation-architectures.json); what it needs in memory is the weights, a KV cache for one full context,
// and vLLM's own working room. Judged before a byte is fetched, as GGUF sets are against llama.cpp.

const known = new Set(table.architectures);

/** The parts of a Hugging Face config.json the judgement reads; every field optional, as configs vary. */
export type HfConfig = {
  architectures?: unknown;
  num_hidden_layers?: unknown;
  num_attention_heads?: unknown;
  num_key_value_heads?: unknown;
  hidden_size?: unknown;
  head_dim?: unknown;
  max_position_embeddings?: unknown;
  torch_dtype?: unknown;
  dtype?: unknown;
  text_config?: unknown;
};

const int = (v: unknown) => (typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : undefined);

/** The architecture config.json names first (what vLLM loads), or null. */
export function configArchitecture(config: HfConfig | null): string | null {
  const list = config?.architectures;
  return Array.isArray(list) && typeof list[0] === 'string' ? list[0] : null;
}

/** Whether vLLM loads this architecture, and why not, in the words an operator needs before a download. */
export function vllmVerdict(config: HfConfig | null): Verdict {
  if (!config)
    return { servable: false, reason: 'the repository has no config.json for vLLM to read', neededBuild: null };
  const arch = configArchitecture(config);
  if (!arch) return { servable: false, reason: 'config.json names no architecture (architectures)', neededBuild: null };
  if (!known.has(arch))
    return {
      servable: false,
      reason: `vLLM has no text-generation model for ${arch} (its model registry, as of ${table.source.split(' at ')[1]?.slice(0, 7)})`,
      neededBuild: null,
    };
  return { servable: true, reason: `vLLM serves ${arch}`, neededBuild: null };
}

// vLLM's working room beyond weights and cache: CUDA graphs, activations, the sampler: about a GiB for small and
// mid-sized models in vLLM's own start-up logs ("model weights took …, non_torch_memory …, activation peak …").
const VLLM_OVERHEAD_BYTES = 2 ** 30;

/**
 * Weights (the safetensors files' bytes) + the KV cache of one sequence at `context` tokens in the weights'
 * 16-bit type + vLLM's working room. vLLM takes a share of the card at start (gpu_memory_utilization, 0.9 by
 * default) and fills what is left with cache, so this is the least a card must have free, not what vLLM will hold.
 */
export function estimateVllmMemory(config: HfConfig, weightsBytes: number, contextCap: number): MemoryEstimate {
  const c = (
    typeof config.text_config === 'object' && config.text_config !== null ? config.text_config : config
  ) as HfConfig;
  const layers = int(c.num_hidden_layers) ?? 0;
  const heads = int(c.num_attention_heads) ?? 0;
  const kvHeads = int(c.num_key_value_heads) ?? heads;
  const headDim = int(c.head_dim) ?? (heads ? Math.floor((int(c.hidden_size) ?? 0) / heads) : 0);
  const context = Math.min(int(c.max_position_embeddings) ?? contextCap, contextCap);
  const kvCacheBytes = 2 * layers * kvHeads * headDim * context * 2;
  const totalBytes = weightsBytes + kvCacheBytes + VLLM_OVERHEAD_BYTES;
  return {
    context,
    weightsBytes,
    kvCacheBytes,
    overheadBytes: VLLM_OVERHEAD_BYTES,
    totalBytes,
    basis: `vLLM: weights as stored; KV cache 2 × ${layers} layers × ${kvHeads} KV heads × ${headDim} × ${context} tokens × 2 bytes; 1 GiB of vLLM's working room. vLLM reserves 90 % of a card at start and fills the rest with cache`,
  };
}
