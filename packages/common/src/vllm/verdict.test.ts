import { describe, expect, it } from 'vitest';
import table from './text-generation-architectures.json' with { type: 'json' };
import { estimateVllmMemory, vllmVerdict } from './verdict.js';

describe("vLLM's judgement of a safetensors repository", () => {
  it('knows the architectures of its model registry and names the one it does not', () => {
    expect(vllmVerdict({ architectures: ['LlamaForCausalLM'] })).toMatchObject({ servable: true });
    expect(vllmVerdict({ architectures: ['Qwen3MoeForCausalLM'] })).toMatchObject({ servable: true });
    expect(vllmVerdict({ architectures: ['NotAModelForCausalLM'] }).reason).toMatch(
      /^vLLM has no text-generation model for NotAModelForCausalLM \(its model registry, as of 0002bff\)$/,
    );
    expect(vllmVerdict({}).reason).toBe('config.json names no architecture (architectures)');
    expect(vllmVerdict(null).reason).toBe('the repository has no config.json for vLLM to read');
    // The table is vLLM's own list, not a handful typed in: it holds the families an operator expects.
    expect(table.architectures.length).toBeGreaterThan(100);
  });

  it('estimates weights + one context of KV cache + working room, reading a nested text_config too', () => {
    const llama8b = {
      num_hidden_layers: 32,
      num_attention_heads: 32,
      num_key_value_heads: 8,
      hidden_size: 4096,
      max_position_embeddings: 131072,
    };
    const m = estimateVllmMemory(llama8b, 16 * 2 ** 30, 8192);
    // 2 (K and V) × 32 layers × 8 KV heads × 128 head size × 8192 tokens × 2 bytes = 1 GiB.
    expect(m.kvCacheBytes).toBe(2 ** 30);
    expect(m.context).toBe(8192);
    expect(m.totalBytes).toBe(16 * 2 ** 30 + 2 ** 30 + 2 ** 30);
    const nested = estimateVllmMemory({ text_config: llama8b }, 0, 8192);
    expect(nested.kvCacheBytes).toBe(2 ** 30);
    // A model trained on less context than the cap is judged at its own.
    expect(estimateVllmMemory({ ...llama8b, max_position_embeddings: 4096 }, 0, 8192).kvCacheBytes).toBe(2 ** 29);
  });
});
