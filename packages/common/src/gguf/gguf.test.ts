import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { knownTensorTypes } from './catalog.js';
import { factsOf } from './facts.js';
import { estimateMemory } from './memory.js';
import { readGguf } from './reader.js';
import { fileSource } from './source.js';
import { verdictFor } from './verdict.js';

const fixture = (name: string) => path.join(new URL('../../test/fixtures/gguf', import.meta.url).pathname, name);

async function read(name: string) {
  const src = await fileSource(fixture(name));
  try {
    const header = await readGguf(src, knownTensorTypes);
    return { header, facts: factsOf(header), bytesRead: src.bytesRead };
  } finally {
    await src.close();
  }
}

describe("real GGUF files from llama.cpp's repository", () => {
  it('reads LLaMA-2-7B hyperparameters from the llama-spm vocabulary file', async () => {
    const { facts, header } = await read('ggml-vocab-llama-spm.gguf');
    expect(header.version).toBe(3);
    expect(facts).toMatchObject({
      architecture: 'llama',
      contextLength: 4096,
      layers: 32,
      embeddingLength: 4096,
      heads: 32,
      kvHeads: 32,
      keyLength: 128,
      valueLength: 128,
      tensorCount: 0,
    });
    // The tokenizer's 32000 tokens are skipped, not held: only their count is kept.
    expect(header.metadata.get('tokenizer.ggml.tokens')).toEqual({ skippedArray: 32000, itemType: 8 });
  });

  it('estimates a 2048 MiB f16 KV cache for LLaMA-2-7B at 4096 context', async () => {
    const { facts } = await read('ggml-vocab-llama-spm.gguf');
    const m = estimateMemory(facts, 0, 4096);
    expect(m.kvCacheBytes).toBe(2048 * 1024 * 1024);
  });

  it.each([
    [
      'ggml-vocab-phi-3.gguf',
      'phi3',
      { layers: 32, embeddingLength: 3072, heads: 32, kvHeads: 32, contextLength: 4096 },
      1536,
    ],
    [
      'ggml-vocab-starcoder.gguf',
      'starcoder2',
      { layers: 30, embeddingLength: 3072, heads: 24, kvHeads: 2, contextLength: 16384 },
      480,
    ],
    ['ggml-vocab-refact.gguf', 'refact', { layers: 32, embeddingLength: 2048, heads: 32, kvHeads: 1 }, 32],
    ['ggml-vocab-baichuan.gguf', 'baichuan', { layers: 32, embeddingLength: 4096 }, null],
    ['ggml-vocab-bert-bge.gguf', 'bert', { layers: 12, embeddingLength: 384 }, null],
  ] as const)('%s is %s', async (file, arch, expected, kvMiB) => {
    const { facts } = await read(file);
    expect(facts.architecture).toBe(arch);
    expect(facts).toMatchObject(expected);
    if (kvMiB !== null)
      expect(estimateMemory(facts, 0, facts.contextLength ?? 0).kvCacheBytes).toBe(kvMiB * 1024 * 1024);
  });
});

describe('the verdict', () => {
  it('says which build an architecture needs and which the nodes run', () => {
    expect(verdictFor('qwen3', 4748, 'the nodes run')).toEqual({
      servable: false,
      reason: 'qwen3 needs llama.cpp b5092; the nodes run b4748',
      neededBuild: 5092,
    });
    expect(verdictFor('qwen3', 6000, 'the nodes run').servable).toBe(true);
  });

  it('never offers a projector, an unimplemented or an unknown architecture', () => {
    expect(verdictFor('clip', 10000, 'x')).toMatchObject({ servable: false, reason: expect.stringMatching(/mmproj/) });
    expect(verdictFor('gptj', 10000, 'x')).toMatchObject({
      servable: false,
      reason: 'llama.cpp names gptj but never implemented it',
    });
    expect(verdictFor('no-such-arch', 10000, 'x')).toMatchObject({
      servable: false,
      reason: expect.stringMatching(/has no architecture named no-such-arch/),
    });
    expect(verdictFor('gpt2', 1500, 'the nodes run')).toMatchObject({
      servable: false,
      reason: 'gpt2 needs llama.cpp b1709; the nodes run b1500',
    });
  });
});
