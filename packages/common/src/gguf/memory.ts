import type { ModelFacts } from './facts.js';

/** A flat allowance for llama.cpp's compute buffers and the GPU runtime's context, stated with every estimate. */
export const OVERHEAD_BYTES = 512 * 1024 * 1024;

export type MemoryEstimate = {
  context: number;
  weightsBytes: number;
  kvCacheBytes: number;
  overheadBytes: number;
  totalBytes: number;
  /** How the numbers were reached, in words, for the operator who doubts them. */
  basis: string;
};

/**
 * Weights + KV cache + overhead. KV = Σ layers n_ctx × (n_embd_k_gqa + n_embd_v_gqa) × bytes per element (2 for
 * the default f16 cache): LLaMA-2-7B at 4096 context is 32 × 4096 × 8192 × 2 = 2 GiB.
 */
export function estimateMemory(
  facts: ModelFacts,
  weightsBytes: number,
  context: number,
  bytesPerElement = 2,
): MemoryEstimate {
  const widths = facts.kvWidthPerLayer ?? [];
  const kvCacheBytes = widths.reduce((n, w) => n + context * w * bytesPerElement, 0);
  const totalBytes = weightsBytes + kvCacheBytes + OVERHEAD_BYTES;
  const basis = widths.length
    ? `weights ${weightsBytes} B + KV cache ${facts.layers} layers × ${context} tokens × f16 + ${OVERHEAD_BYTES >> 20} MiB overhead`
    : `weights ${weightsBytes} B + ${OVERHEAD_BYTES >> 20} MiB overhead (the header gives no attention shape: no KV cache counted)`;
  return { context, weightsBytes, kvCacheBytes, overheadBytes: OVERHEAD_BYTES, totalBytes, basis };
}
