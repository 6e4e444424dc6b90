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
      [node('gpu-1', 12), node('gpu-2', 20), node('gpu-3', 8)],
      [],
      now,
    );
    expect(a.place.map((p) => p.nodeId)).toEqual(['gpu-2', 'gpu-1']);
  });

  it('says why a replica is pending', () => {
    const a = decide([model()], [node('gpu-1', 6), node('gpu-2', 7.5)], [], now);
    expect(a.place).toEqual([
      { modelId: 'm1', nodeId: null, message: 'fits on no node: needs 10.0 GiB, the most free is 7.5 GiB on gpu-2' },
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
      { modelId: 'm1', nodeId: null, message: 'fits on no node: needs 10.0 GiB, the most free is 5.0 GiB on gpu-1' },
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
      [twoGpus('gpu-1', [20, 20]), node('gpu-2', 12)],
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

  it('takes the node as a whole for a model that fits only split across its GPUs', () => {
    const a = decide([model({ memoryBytes: BigInt(30 * GiB) })], [twoGpus('gpu-1', [20, 20])], [], now);
    expect(a.place).toEqual([{ modelId: 'm1', nodeId: 'gpu-1', message: null }]);
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
