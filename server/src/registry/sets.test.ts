import { describe, expect, it } from 'vitest';
import { groupSets, suggestedModelName } from './sets.js';

const f = (path: string, size = 1000) => ({ path, size, sha256: null });

describe('grouping a repository into fetchable sets', () => {
  it('groups a realistic GGUF repository: quantisations, a shard set, mmproj and imatrix', () => {
    const sets = groupSets([
      f('README.md', 5),
      f('config.json', 5),
      f('Qwen3-8B-Q4_K_M.gguf', 5_000),
      f('Qwen3-8B-Q8_0.gguf', 9_000),
      f('Qwen3-8B-IQ4_XS.gguf', 4_500),
      f('Qwen3-8B-F16-00001-of-00003.gguf', 6_000),
      f('Qwen3-8B-F16-00002-of-00003.gguf', 6_000),
      f('Qwen3-8B-F16-00003-of-00003.gguf', 4_000),
      f('mmproj-Qwen3-8B-F16.gguf', 600),
      f('Qwen3-8B.imatrix', 50),
      f('imatrix.dat', 50),
    ]);
    expect(sets.map((s) => [s.kind, s.quant, s.files.length, s.totalBytes, s.complete])).toEqual([
      ['MODEL', 'IQ4_XS', 1, 4_500, true],
      ['MODEL', 'Q4_K_M', 1, 5_000, true],
      ['MODEL', 'Q8_0', 1, 9_000, true],
      ['MODEL', 'F16', 3, 16_000, true],
      ['MMPROJ', 'F16', 1, 600, true],
      ['IMATRIX', null, 1, 50, true],
    ]);
    expect(sets.find((s) => s.quant === 'F16' && s.kind === 'MODEL')?.id).toBe('model:Qwen3-8B-F16');
  });

  it('reads the quantisation from a folder, and notices a missing shard', () => {
    const sets = groupSets([
      f('Q4_K_M/Big-Model-00001-of-00003.gguf'),
      f('Q4_K_M/Big-Model-00003-of-00003.gguf'),
      f('Q8_0/Big-Model-00001-of-00002.gguf'),
      f('Q8_0/Big-Model-00002-of-00002.gguf'),
    ]);
    expect(sets.map((s) => [s.quant, s.files.length, s.shardCount, s.complete])).toEqual([
      ['Q4_K_M', 2, 3, false],
      ['Q8_0', 2, 2, true],
    ]);
  });

  it('makes safetensors shards one set and leaves adapters and configs out', () => {
    const sets = groupSets([
      f('model-00001-of-00004.safetensors'),
      f('model-00002-of-00004.safetensors'),
      f('model-00003-of-00004.safetensors'),
      f('model-00004-of-00004.safetensors'),
      f('model.safetensors.index.json'),
      f('adapter_model.safetensors'),
      f('tokenizer.json'),
    ]);
    expect(sets).toHaveLength(1);
    expect(sets[0]).toMatchObject({
      format: 'SAFETENSORS',
      kind: 'MODEL',
      shardCount: 4,
      complete: true,
      id: 'safetensors:model',
    });
  });

  it('suggests the catalog name a person would', () => {
    expect(suggestedModelName('unsloth/Qwen3-8B-GGUF')).toBe('qwen3-8b');
    expect(suggestedModelName('bartowski/Llama-3.2-1B-Instruct-GGUF')).toBe('llama-3.2-1b-instruct');
    expect(suggestedModelName('Qwen/Qwen3-8B')).toBe('qwen3-8b');
  });
});
