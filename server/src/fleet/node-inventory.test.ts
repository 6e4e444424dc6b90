import { describe, expect, it } from 'vitest';
import { freeMiB, largestCard, largestFreeMiB, nodeEngines, nodeGpus, runsEngine } from './node-inventory.js';

// The one reader of a node's GPUs and engines: what agents report reads back as it was sent, and rows from before
// reports were checked read without throwing, numbered and zeroed as placement always read them.

const reported = {
  gpus: [
    { index: 0, name: 'RTX 4090', totalMiB: 24_564, freeMiB: 20_000 },
    { index: 1, name: 'RTX 4090', totalMiB: 24_564, freeMiB: 23_000 },
  ],
  engines: [
    { name: 'llama.cpp', version: 'b4500', build: 4500 },
    { name: 'vllm', version: null, build: null },
  ],
};

describe("a node's inventory", () => {
  it('reads a report as the agent sent it', () => {
    expect(nodeGpus(reported)).toEqual(reported.gpus);
    expect(nodeEngines(reported)).toEqual(reported.engines);
    expect(runsEngine(reported, 'vllm')).toBe(true);
    expect(runsEngine(reported, 'sglang')).toBe(false);
  });

  it('sums free memory over the cards for a model, and takes the one card with most for a training job', () => {
    expect(freeMiB(reported)).toBe(43_000);
    expect(largestFreeMiB(reported)).toBe(23_000);
    // The first of equal cards, as its agent numbered them.
    expect(largestCard(reported)).toMatchObject({ index: 0, totalMiB: 24_564 });
  });

  it('reads old and odd rows without throwing: no index is the place in the report, a missing figure is 0', () => {
    const old = { gpus: [{ freeMiB: 1000 }, null, { index: 7, name: 'A100', totalMiB: 'lots' }], engines: [{}, 3] };
    expect(nodeGpus(old)).toEqual([
      { index: 0, name: 'GPU', totalMiB: 0, freeMiB: 1000 },
      { index: 1, name: 'GPU', totalMiB: 0, freeMiB: 0 },
      { index: 7, name: 'A100', totalMiB: 0, freeMiB: 0 },
    ]);
    expect(nodeEngines(old)).toEqual([]);
    for (const none of [
      { gpus: null, engines: null },
      { gpus: {}, engines: 'llama.cpp' },
      { gpus: [], engines: [] },
    ]) {
      expect(nodeGpus(none)).toEqual([]);
      expect(nodeEngines(none)).toEqual([]);
      expect(freeMiB(none)).toBe(0);
      expect(largestFreeMiB(none)).toBe(0);
      expect(largestCard(none)).toBeNull();
    }
  });
});
