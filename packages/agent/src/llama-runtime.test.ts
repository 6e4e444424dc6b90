import fs from 'node:fs/promises';
import path from 'node:path';
import { knownTensorTypes } from '@hangar/common/gguf/catalog';
import { readGguf } from '@hangar/common/gguf/reader';
import { fileSource } from '@hangar/common/gguf/source';
import { tinyLlamaShards, writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { llamaCppBuildOf } from './inventory.js';
import { LlamaRuntime } from './llama-runtime.js';

// Real llama.cpp (node-llama-cpp's CPU prebuilt) on the tiny random-weight model: one runtime and one file for
// the whole file. One thread: CI has two cores, and llama.cpp's spinning threads crawl when they outnumber them.

let runtime: LlamaRuntime;
let tiny: Awaited<ReturnType<typeof writeTinyLlama>>;

beforeAll(async () => {
  tiny = await writeTinyLlama();
  runtime = await LlamaRuntime.create({ threads: 1 });
});
afterAll(async () => {
  await runtime?.dispose(500);
  await fs.rm(path.dirname(tiny.file), { recursive: true, force: true });
});

describe('the tiny llama fixture', () => {
  it('is a GGUF the server reads as a llama with the 32000-token vocabulary', async () => {
    const src = await fileSource(tiny.file);
    const h = await readGguf(src, knownTensorTypes).finally(() => src.close());
    expect(h.metadata.get('general.architecture')).toBe('llama');
    expect(h.metadata.get('llama.embedding_length')).toBe(64);
    expect(h.metadata.get('tokenizer.ggml.model')).toBe('llama');
    expect(h.metadata.get('tokenizer.ggml.tokens')).toMatchObject({ skippedArray: 32000 });
    expect(h.tensors.map((t) => t.name)).toContain('blk.1.ffn_down.weight');
    expect(h.tensors.find((t) => t.name === 'token_embd.weight')?.dims).toEqual([64, 32000]);
    // Data starts at the header padded to 32, and ends exactly at the end of the file.
    const last = h.tensors.at(-1)!;
    const dataStart = Math.ceil(h.headerBytes / 32) * 32;
    expect(dataStart + Number(last.offset) + 64 * 32000 * 4).toBe(tiny.bytes);
  });
});

describe('LlamaRuntime', () => {
  it('loads the tiny model on CPU and generates in the smoke test', async () => {
    expect(llamaCppBuildOf(runtime.release)).not.toBeNull();
    const loaded = await runtime.load(tiny.file, { contextSize: 512 });
    try {
      const smoke = await loaded.smoke();
      expect(smoke.tokens).toBeGreaterThanOrEqual(1);
      expect(typeof smoke.text).toBe('string');
      expect(smoke.text.length).toBeGreaterThan(0);
      expect(smoke.tokensPerSecond).toBeGreaterThan(0);
      console.info(
        `smoke test on this CPU: ${smoke.tokens} tokens in ${smoke.ms.toFixed(1)} ms = ${smoke.tokensPerSecond.toFixed(1)} tokens/s`,
      );
      // Greedy: the same model says the same thing again.
      expect((await loaded.smoke()).text).toBe(smoke.text);
    } finally {
      await loaded.dispose();
    }
  });

  it('loads a split model from its first shard, with the others beside it', async () => {
    const dir = path.dirname(tiny.file);
    const shards = tinyLlamaShards(3);
    for (const [i, body] of shards.entries())
      await fs.writeFile(path.join(dir, `split-0000${i + 1}-of-00003.gguf`), body);
    const loaded = await runtime.load(path.join(dir, 'split-00001-of-00003.gguf'), { contextSize: 256 });
    try {
      expect((await loaded.smoke({ maxTokens: 2 })).tokens).toBeGreaterThanOrEqual(1);
    } finally {
      await loaded.dispose();
    }
  });

  it("fails with llama.cpp's own reason on a damaged file", async () => {
    const dir = path.dirname(tiny.file);
    const notGguf = path.join(dir, 'not.gguf');
    await fs.writeFile(notGguf, 'this is not a model');
    await expect(runtime.load(notGguf, { contextSize: 512 })).rejects.toThrow(/Invalid GGUF magic/);
    const cut = path.join(dir, 'cut.gguf');
    const whole = await fs.readFile(tiny.file);
    await fs.writeFile(cut, whole.subarray(0, whole.length - 4096));
    await expect(runtime.load(cut, { contextSize: 512 })).rejects.toThrow(
      /Failed to load model: .*not within the file bounds/,
    );
  });
});
