import fs from 'node:fs/promises';
import path from 'node:path';
import { writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { LlamaRuntime } from './llama-runtime.js';

// A file of its own, so a process of its own: node-llama-cpp shares one binding per process, and the logger of
// the last runtime created there is the one llama.cpp's lines reach (the agent creates one runtime per process).

let tiny: Awaited<ReturnType<typeof writeTinyLlama>>;
beforeAll(async () => {
  tiny = await writeTinyLlama();
});
afterAll(async () => {
  await fs.rm(path.dirname(tiny.file), { recursive: true, force: true });
});

it("with gpu: 'auto', uses a GPU build when one is installed and says what the model holds on the card", async () => {
  // No GPU build is installed here (pnpm-workspace.yaml leaves them out), so this is the CPU fallback; on a
  // node with the CUDA prebuilt the same assertions hold with the layers on the GPU.
  const auto = await LlamaRuntime.create({ gpu: 'auto', threads: 1 });
  try {
    const loaded = await auto.load(tiny.file, { contextSize: 128, parallel: 2, gpuLayers: 'max' });
    try {
      expect(loaded.context.totalSequences).toBe(2);
      expect(loaded.memory.gpu).toBe(auto.gpu);
      expect(loaded.memory.totalLayers).toBe(loaded.model.fileInsights.totalLayers);
      if (auto.gpu === false) expect(loaded.memory).toMatchObject({ gpuLayers: 0, vramUsedBytes: 0 });
      else {
        expect(loaded.memory.gpuLayers).toBe(loaded.memory.totalLayers);
        expect(loaded.memory.vramUsedBytes).toBeGreaterThan(0);
      }
      console.info(`gpu: 'auto' on this machine: ${JSON.stringify(loaded.memory)}`);
      expect((await loaded.smoke({ maxTokens: 2 })).tokens).toBeGreaterThanOrEqual(1);
    } finally {
      await loaded.dispose();
    }
  } finally {
    await auto.dispose(500);
  }
});
