import { describe, expect, it } from 'vitest';
import { loadConfig } from '../config.js';
import { bookedShare, GpuLedger, marginMiB, roomMiB } from './gpu-room.js';

describe('HANGAR_GPU_MEMORY_MARGIN', () => {
  it('is 10 % of each card unless set to a share or a size, and names what it accepts', () => {
    expect(loadConfig({}).gpuMemoryMargin).toEqual({ percent: 10 });
    expect(marginMiB(loadConfig({}).gpuMemoryMargin, 24_576)).toBe(2458);
    expect(loadConfig({ HANGAR_GPU_MEMORY_MARGIN: '5%' }).gpuMemoryMargin).toEqual({ percent: 5 });
    expect(loadConfig({ HANGAR_GPU_MEMORY_MARGIN: '512MiB' }).gpuMemoryMargin).toEqual({ mib: 512 });
    expect(loadConfig({ HANGAR_GPU_MEMORY_MARGIN: '1 GiB' }).gpuMemoryMargin).toEqual({ mib: 1024 });
    expect(() => loadConfig({ HANGAR_GPU_MEMORY_MARGIN: 'lots' })).toThrow(
      /HANGAR_GPU_MEMORY_MARGIN="lots" is not accepted: a share of each card below 90% \("10%"\) or a size in MiB or GiB/,
    );
    expect(() => loadConfig({ HANGAR_GPU_MEMORY_MARGIN: '95%' })).toThrow(/HANGAR_GPU_MEMORY_MARGIN="95%"/);
  });
});

describe('a card’s room', () => {
  it('is its size less the margin, what Hangar’s replicas hold and what else uses it', () => {
    const node = {
      id: 'n',
      name: 'n',
      gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24_576, freeMiB: 10_240 }],
    };
    // One loaded replica measured at 6 GiB; the card reports 14 GiB in use: 8 GiB of it is not Hangar's.
    const ledger = new GpuLedger(
      [node],
      [
        {
          modelId: 'm',
          nodeId: 'n',
          state: 'READY',
          gpuIndex: 0,
          servingAt: new Date(),
          gpuLayers: 33,
          vramUsedBytes: BigInt(6 * 1024 ** 3),
        },
      ],
      () => BigInt(8 * 1024 ** 3),
      { mib: 1024 },
    );
    const [card] = ledger.of('n');
    expect(card).toMatchObject({ totalMiB: 24_576, marginMiB: 1024, heldMiB: 6144, othersMiB: 8192, replicas: 1 });
    expect(roomMiB(card!)).toBe(24_576 - 1024 - 6144 - 8192);
  });
});

describe('the share of its cards a replica was booked (vLLM’s --gpu-memory-utilization)', () => {
  const node = {
    gpus: [
      { index: 0, name: 'A', totalMiB: 24_576, freeMiB: 24_576 },
      { index: 1, name: 'A', totalMiB: 24_576, freeMiB: 24_576 },
    ],
  };
  it('is its plan over its card, rounded up, per card when split; none on the node as a whole or without a plan', () => {
    expect(bookedShare({ gpuIndex: 0 }, node, BigInt(8 * 1024 ** 3))).toBe(0.34);
    expect(bookedShare({ gpuIndex: null, gpuIndexes: [0, 1] }, node, BigInt(30 * 1024 ** 3))).toBe(0.63);
    expect(bookedShare({ gpuIndex: 0 }, node, BigInt(40 * 1024 ** 3))).toBe(0.95);
    expect(bookedShare({ gpuIndex: null }, node, BigInt(8 * 1024 ** 3))).toBeNull();
    expect(bookedShare({ gpuIndex: 0 }, node, null)).toBeNull();
  });
});
