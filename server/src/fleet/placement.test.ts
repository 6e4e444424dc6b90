import { describe, expect, it } from 'vitest';
import { decide, type PlacementModel, type PlacementNode, type PlacementReplica, wanted } from './placement.js';

const GiB = 1024 ** 3;
const now = new Date('2026-11-30T00:00:00Z');
const model = (o: Partial<PlacementModel> = {}): PlacementModel => ({
  id: 'm1',
  name: 'qwen3-8b',
  engine: 'llamacpp',
  memoryBytes: BigInt(10 * GiB),
  minReplicas: 1,
  maxReplicas: 1,
  awakeUntil: null,
  ...o,
});
const node = (id: string, freeGiB: number, o: Partial<PlacementNode> = {}): PlacementNode => ({
  id,
  name: id,
  online: true,
  gpus: [{ name: 'GPU', totalMiB: 24 * 1024, freeMiB: freeGiB * 1024 }],
  engines: [{ name: 'llama.cpp', build: 6000 }],
  ...o,
});
const replica = (o: Partial<PlacementReplica>): PlacementReplica => ({
  id: 'r1',
  modelId: 'm1',
  nodeId: null,
  state: 'PENDING',
  desired: 'RUN',
  createdAt: new Date(now.getTime() - 1000),
  ...o,
});

describe('placement', () => {
  it('wants replicas by mode: always its count, on demand while woken, stopped none', () => {
    expect(wanted(model({ minReplicas: 2, maxReplicas: 2 }), now)).toBe(2);
    expect(wanted(model({ minReplicas: 0, maxReplicas: 1 }), now)).toBe(0);
    expect(wanted(model({ minReplicas: 0, maxReplicas: 1, awakeUntil: new Date(now.getTime() + 60_000) }), now)).toBe(
      1,
    );
    expect(wanted(model({ minReplicas: 0, maxReplicas: 0 }), now)).toBe(0);
  });

  it('places on the node with the most room that fits, one replica per node', () => {
    const a = decide(
      [model({ minReplicas: 2, maxReplicas: 2 })],
      [node('gpu-1', 14), node('gpu-2', 20), node('gpu-3', 8)],
      [],
      now,
    );
    expect(a.place.map((p) => p.nodeId)).toEqual(['gpu-2', 'gpu-1']);
  });

  it('says why a replica is pending', () => {
    const a = decide([model()], [node('gpu-1', 6), node('gpu-2', 7.5)], [], now);
    expect(a.place).toEqual([
      {
        modelId: 'm1',
        nodeId: null,
        message:
          'fits on no node: needs 10.0 GiB, the most room is 5.1 GiB on gpu-2 GPU 0 (of 24.0 GiB: 16.5 GiB in use outside Hangar, 2.4 GiB kept free by HANGAR_GPU_MEMORY_MARGIN). It is placed once a card (or the cards of one node together) has that room: when a replica there stops, a node with more GPU memory joins, or HANGAR_GPU_MEMORY_MARGIN is lowered',
      },
    ]);
    expect(decide([model()], [node('gpu-1', 20, { online: false })], [], now).place[0]?.message).toBe(
      'no node is online',
    );
    expect(decide([model({ engine: 'vllm' })], [node('gpu-1', 20)], [], now).place[0]?.message).toBe(
      'no online node runs vllm',
    );
  });

  it('counts memory promised to replicas still loading', () => {
    const other = model({ id: 'm2', name: 'other' });
    const a = decide(
      [model(), other],
      [node('gpu-1', 15)],
      [replica({ id: 'r0', modelId: 'm2', nodeId: 'gpu-1', state: 'LOADING' })],
      now,
    );
    expect(a.place).toEqual([
      {
        modelId: 'm1',
        nodeId: null,
        message: expect.stringMatching(
          /^fits on no node: needs 10\.0 GiB, the most room is 2\.6 GiB on gpu-1 GPU 0 \(of 24\.0 GiB: 10\.0 GiB held by 1 replica, 9\.0 GiB in use outside Hangar, /,
        ),
      },
    ]);
  });

  it('marks replicas of a vanished node lost and replaces them', () => {
    const a = decide(
      [model()],
      [node('gpu-1', 20, { online: false }), node('gpu-2', 20)],
      [replica({ nodeId: 'gpu-1', state: 'READY' })],
      now,
    );
    expect(a.lost).toEqual([{ replicaId: 'r1', message: 'node gpu-1 stopped reporting' }]);
    expect(a.place.map((p) => p.nodeId)).toEqual(['gpu-2']);
  });

  it('places again a pending replica whose node went offline before its agent took it up', () => {
    const pending = replica({ nodeId: 'gpu-1', state: 'PENDING' });
    const gone = node('gpu-1', 20, { online: false });
    expect(decide([model()], [gone, node('gpu-2', 20)], [pending], now).place).toEqual([
      { modelId: 'm1', nodeId: 'gpu-2', message: null, replicaId: 'r1', gpuIndex: 0 },
    ]);
    expect(decide([model()], [gone], [pending], now).place).toEqual([
      { modelId: 'm1', nodeId: null, message: 'no node is online', replicaId: 'r1' },
    ]);
    // On a node still online it waits for that node's agent.
    expect(decide([model()], [node('gpu-1', 20)], [pending], now).place).toEqual([]);
  });

  it('stops the extra replicas, newest first, when the count goes down', () => {
    const rs = [
      replica({ id: 'old', nodeId: 'gpu-1', state: 'READY' }),
      replica({ id: 'new', nodeId: 'gpu-2', state: 'READY', createdAt: now }),
    ];
    const a = decide([model()], [node('gpu-1', 20), node('gpu-2', 20)], rs, now);
    expect(a.stop).toEqual(['new']);
    expect(
      decide([model({ maxReplicas: 0, minReplicas: 0 })], [node('gpu-1', 20), node('gpu-2', 20)], rs, now).stop,
    ).toEqual(['old', 'new']);
  });

  it('does not place again where the model just failed', () => {
    const a = decide([model()], [node('gpu-1', 20)], [replica({ nodeId: 'gpu-1', state: 'FAILED' })], now);
    expect(a.place[0]).toMatchObject({ nodeId: null, message: expect.stringMatching(/failed to load it lately/) });
  });
});

describe('a node shutting down', () => {
  it('is not given a new replica right after its agent stopped one on its own', () => {
    const stoppedByAgent = replica({ nodeId: 'gpu-1', state: 'STOPPED', desired: 'RUN', updatedAt: now });
    const a = decide([model()], [node('gpu-1', 20), node('gpu-2', 20)], [stoppedByAgent], now);
    expect(a.place.map((p) => p.nodeId)).toEqual(['gpu-2']);
  });
});

describe('a node with several GPUs', () => {
  const twoGpus = (id: string, freeGiB: number[]) =>
    node(id, 0, {
      gpus: freeGiB.map((f, index) => ({ index, name: 'RTX 4090', totalMiB: 24 * 1024, freeMiB: f * 1024 })),
    });

  it('places a replica on each GPU that holds one alone, recording which', () => {
    const a = decide([model({ minReplicas: 2, maxReplicas: 2 })], [twoGpus('gpu-1', [20, 20])], [], now);
    expect(a.place).toEqual([
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 0 },
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 1 },
    ]);
  });

  it('prefers another machine for the second copy, and counts what is promised per GPU', () => {
    const spread = decide(
      [model({ minReplicas: 2, maxReplicas: 2 })],
      [twoGpus('gpu-1', [20, 20]), node('gpu-2', 16)],
      [],
      now,
    );
    expect(spread.place.map((p) => [p.nodeId, p.gpuIndex])).toEqual([
      ['gpu-1', 0],
      ['gpu-2', 0],
    ]);
    // GPU 0 already promised to a loading replica of another model: the next goes on GPU 1.
    const other = model({ id: 'm2', name: 'other' });
    const promised = decide(
      [model(), other],
      [twoGpus('gpu-1', [15, 15])],
      [replica({ id: 'r0', modelId: 'm2', nodeId: 'gpu-1', gpuIndex: 0, state: 'LOADING' })],
      now,
    );
    expect(promised.place).toEqual([{ modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 1 }]);
  });

  it('splits a model too large for one card across the cards of one node that hold it together', () => {
    const a = decide([model({ memoryBytes: BigInt(30 * GiB) })], [twoGpus('gpu-1', [20, 20])], [], now);
    expect(a.place).toEqual([{ modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndexes: [0, 1] }]);
  });
});

describe('a wake while a replica is being stopped', () => {
  it('keeps the replica its agent has not stopped yet instead of placing a cold one', () => {
    const awake = model({ minReplicas: 0, maxReplicas: 1, awakeUntil: new Date(now.getTime() + 60_000) });
    const stopping = replica({ nodeId: 'gpu-1', state: 'READY', desired: 'STOP' });
    const a = decide([awake], [node('gpu-1', 20)], [stopping], now);
    expect(a.keep).toEqual(['r1']);
    expect(a.place).toEqual([]);
    // Asleep, it is left to stop.
    expect(decide([model({ minReplicas: 0, maxReplicas: 1 })], [node('gpu-1', 20)], [stopping], now).keep).toEqual([]);
  });
});

describe('placement by memory, not by card', () => {
  const card = (freeGiB = 24) => ({ index: 0, name: 'RTX 4090', totalMiB: 24 * 1024, freeMiB: freeGiB * 1024 });
  const oneCard = (id: string, freeGiB = 24) => node(id, 0, { gpus: [card(freeGiB)] });
  const cards = (id: string, n: number) =>
    node(id, 0, { gpus: Array.from({ length: n }, (_, index) => ({ ...card(), index })) });
  const eight = (o: Partial<PlacementModel> = {}) =>
    model({ memoryBytes: BigInt(8 * GiB), minReplicas: 3, maxReplicas: 3, ...o });

  it('puts two 8 GiB replicas on one 24 GiB card, and the third waits saying why and what would make it fit', () => {
    const a = decide([eight()], [oneCard('gpu-1')], [], now);
    expect(a.place).toEqual([
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 0 },
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 0 },
      {
        modelId: 'm1',
        nodeId: null,
        message:
          'fits on no node: needs 8.0 GiB, the most room is 5.6 GiB on gpu-1 GPU 0 (of 24.0 GiB: 16.0 GiB held by 2 replicas, 2.4 GiB kept free by HANGAR_GPU_MEMORY_MARGIN). It is placed once a card (or the cards of one node together) has that room: when a replica there stops, a node with more GPU memory joins, or HANGAR_GPU_MEMORY_MARGIN is lowered',
      },
    ]);
    // Without a margin the third fits to the last MiB; a margin given as a size keeps it out again.
    expect(
      decide([eight()], [oneCard('gpu-1')], [], now, { margin: { percent: 0 } }).place.map((p) => p.nodeId),
    ).toEqual(['gpu-1', 'gpu-1', 'gpu-1']);
    expect(decide([eight()], [oneCard('gpu-1')], [], now, { margin: { mib: 512 } }).place.at(-1)?.nodeId).toBeNull();
  });

  it('books what loaded replicas measured, the plan before, and a replica asked to stop until it has', () => {
    const loaded = (id: string, vramGiB: number, gpuLayers = 33) =>
      replica({
        id,
        nodeId: 'gpu-1',
        gpuIndex: 0,
        state: 'READY',
        servingAt: now,
        gpuLayers,
        vramUsedBytes: BigInt(vramGiB * GiB),
      });
    // Two replicas that really hold 5 GiB each (the card reports 10 GiB in use): room for a third of 8 GiB.
    const measured = [loaded('a', 5), loaded('b', 5)];
    expect(decide([eight()], [oneCard('gpu-1', 14)], measured, now).place).toEqual([
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndex: 0 },
    ]);
    // Loaded on llama.cpp's CPU build (no layer on a GPU), their 0 bytes say nothing of the card: the plan counts.
    const onCpu = [loaded('a', 0, 0), loaded('b', 0, 0)];
    expect(decide([eight()], [oneCard('gpu-1')], onCpu, now).place).toEqual([
      expect.objectContaining({ nodeId: null, message: expect.stringContaining('16.0 GiB held by 2 replicas') }),
    ]);
    // Still loading: its plan is booked, so a pass while it loads does not promise its memory again.
    const loading = replica({ id: 'c', modelId: 'm2', nodeId: 'gpu-1', gpuIndex: 0, state: 'LOADING' });
    const other = model({ id: 'm2', name: 'other', memoryBytes: BigInt(16 * GiB) });
    expect(
      decide([eight({ minReplicas: 1, maxReplicas: 1 }), other], [oneCard('gpu-1')], [loading], now).place,
    ).toEqual([
      expect.objectContaining({ nodeId: null, message: expect.stringContaining('16.0 GiB held by 1 replica') }),
    ]);
    // Asked to stop, but its agent has not stopped it yet: its memory is still taken.
    const stopping = { ...loaded('d', 16), modelId: 'm2', desired: 'STOP' as const };
    expect(
      decide([eight({ minReplicas: 1, maxReplicas: 1 }), other], [oneCard('gpu-1', 8)], [stopping], now).place,
    ).toEqual([expect.objectContaining({ nodeId: null })]);
  });

  it('keeps off what the card reports in use outside Hangar', () => {
    const a = decide([eight({ minReplicas: 1, maxReplicas: 1 })], [oneCard('gpu-1', 10)], [], now);
    expect(a.place[0]?.message).toMatch(
      /^fits on no node: needs 8\.0 GiB, the most room is 7\.6 GiB on gpu-1 GPU 0 \(of 24\.0 GiB: 14\.0 GiB in use outside Hangar, /,
    );
  });

  it('splits over the fewest cards of one node that hold the model together, never across nodes', () => {
    const big = (gib: number, o: Partial<PlacementModel> = {}) => model({ memoryBytes: BigInt(gib * GiB), ...o });
    expect(decide([big(30)], [cards('gpu-1', 4)], [], now).place).toEqual([
      { modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndexes: [0, 1] },
    ]);
    expect(decide([big(50)], [cards('gpu-1', 4)], [], now).place[0]?.gpuIndexes).toEqual([0, 1, 2]);
    // vLLM's tensor parallelism takes 2, 4 or 8 cards: 50 GiB goes on four.
    const vllm = { engines: [{ name: 'vllm', version: null, build: null }] };
    expect(
      decide(
        [big(50, { engine: 'vllm' })],
        [cards('gpu-1', 4)].map((n) => ({ ...n, ...vllm })),
        [],
        now,
      ).place[0]?.gpuIndexes,
    ).toEqual([0, 1, 2, 3]);
    // One card on each of two nodes: together they would hold it, but a model is split within one node only.
    const apart = decide([big(30)], [oneCard('gpu-1'), oneCard('gpu-2')], [], now);
    expect(apart.place).toEqual([
      expect.objectContaining({
        nodeId: null,
        message: expect.stringMatching(/^fits on no node: needs 30\.0 GiB, the most room is 21\.6 GiB on gpu-1 GPU 0/),
      }),
    ]);
    // A split replica books its share on each of its cards: 15 GiB of each. What is left of the two (6.6 GiB on
    // each) takes another split of 8 GiB, not one of 16.
    const split = replica({ id: 's', modelId: 'm2', nodeId: 'gpu-1', gpuIndexes: [0, 1], state: 'LOADING' });
    const nodes = [cards('gpu-1', 2)];
    const beside = (gib: number) =>
      decide([big(gib, { minReplicas: 1, maxReplicas: 1 }), big(30, { id: 'm2', name: 'big' })], nodes, [split], now);
    expect(beside(8).place).toEqual([{ modelId: 'm1', nodeId: 'gpu-1', message: null, gpuIndexes: [0, 1] }]);
    expect(beside(16).place).toEqual([
      expect.objectContaining({ nodeId: null, message: expect.stringContaining('15.0 GiB held by 1 replica') }),
    ]);
  });
});
