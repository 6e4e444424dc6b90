import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { writeAdapterDir } from '@hangar/common/test/fixtures/adapter-dir';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama, tinyLlamaShards } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeControlPlane } from '../test/fixtures/fake-control-plane.js';
import type { ControlPlane, PushedAssignments } from './control-plane.js';
import { LlamaRuntime } from './llama-runtime.js';
import { ModelCache } from './model-cache.js';
import { Runner } from './runner.js';

// The runner against an in-memory control plane (the node API is the lead's, still to come), with the real
// pieces under it: files from a real HTTP server that answers like the mirror, and llama.cpp on CPU.

let up: Upstream;
let dir: string;
let runtime: LlamaRuntime;
const tiny = tinyLlama();

beforeAll(async () => {
  up = await startUpstream();
  up.files.set('tiny.gguf', { body: tiny });
  up.files.set('tiny-4k.gguf', { body: tinyLlama({ context: 4096 }) });
  for (const [i, body] of tinyLlamaShards(2).entries()) up.files.set(`tiny-0000${i + 1}-of-00002.gguf`, { body });
  up.files.set('not-a-model.gguf', { body: bytes(4096) });
  up.files.set('cut.gguf', { body: tiny.subarray(0, tiny.length - 4096) });
  up.files.set('tampered.gguf', { body: tiny, fault: { kind: 'wrong-bytes' } });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-runner-'));
  runtime = await LlamaRuntime.create({ threads: 1 });
});
afterAll(async () => {
  await runtime?.dispose(500);
  await up.close();
  await fs.rm(dir, { recursive: true, force: true });
});

let caches = 0;
const runners: Runner[] = [];
afterEach(async () => {
  await Promise.all(runners.splice(0).map((r) => r.stopAll(100)));
});

function setup(o: { vllmCommand?: string[] | null } = {}) {
  const cp = new FakeControlPlane();
  const cacheDir = path.join(dir, `cache-${++caches}`);
  const runner = new Runner({
    controlPlane: cp,
    // A cache per test: the cache is by content, and the tampered file claims the tiny model's sha256.
    cache: new ModelCache(cacheDir, { backoffMs: 10 }),
    runtime: async () => runtime,
    vllmCommand: async () => o.vllmCommand ?? null,
    baseUrl: 'http://hangar.invalid',
    log: createLogger('silent'),
  });
  runners.push(runner);
  /** Polls as the timer would until the replica's last report is `state`. */
  const until = async (replicaId: string, state: string) => {
    const deadline = Date.now() + 20_000;
    while (cp.last(replicaId)?.state !== state) {
      if (Date.now() > deadline)
        throw new Error(`${replicaId} is ${JSON.stringify(cp.last(replicaId))}, not ${state}, after 20 s`);
      await runner.poll();
      await new Promise((r) => setTimeout(r, 20));
    }
    return cp.last(replicaId)!;
  };
  return { cp, runner, until, cacheDir };
}

describe('Runner', () => {
  it('runs a RUN assignment to READY with a smoke test, and stops it on STOP', async () => {
    const { cp, runner, until } = setup();
    cp.assign({ replicaId: 'r1', source: up.url('tiny-4k.gguf'), contextSize: 100_000 });
    const ready = await until('r1', 'READY');
    expect(cp.states('r1')[0]).toBe('LOADING');
    expect(ready.smokeText).toEqual(expect.any(String));
    expect(ready.tokensPerSecond).toBeGreaterThan(0);
    // The context is capped at 2048 tokens, whatever the assignment asks (the model was trained on 4096).
    expect(ready.message).toMatch(/a 2048-token context; in-process it made \d+ tokens/);

    cp.desire('r1', 'STOP');
    expect(await until('r1', 'STOPPED')).toMatchObject({ smokeText: null, tokensPerSecond: null });
    expect(runner.snapshot()).toEqual([
      { replicaId: 'r1', state: 'STOPPED', message: 'stopped, as the control plane asked', reported: true },
    ]);
    cp.unassign('r1');
    await runner.poll();
    expect(runner.snapshot()).toEqual([]);
  });

  it("loads the model's LoRA adapters each into a context of its own; a bad one is said and the base serves on", async () => {
    const dirOf = await writeAdapterDir();
    const lora = peftToGguf({
      config: JSON.parse(await fs.readFile(path.join(dirOf, 'adapter_config.json'), 'utf8')),
      safetensors: await fs.readFile(path.join(dirOf, 'adapter_model.safetensors')),
      base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
    });
    up.files.set('tiny-lora.gguf', { body: lora });
    const { cp, runner, until } = setup();
    cp.assign({
      replicaId: 'with-adapters',
      source: up.url('tiny.gguf'),
      adapters: [
        { name: 'tiny-lora', source: up.url('tiny-lora.gguf') },
        { name: 'not-an-adapter', source: up.url('not-a-model.gguf') },
      ],
    });
    const ready = await until('with-adapters', 'READY');
    expect(ready.message).toMatch(/adapters: tiny-lora \(\d+ tokens\), adapter "not-an-adapter" did not load on \S+: /);
    expect(ready.smokeText).toEqual(expect.any(String));
    await runner.stopAll(100);
  });

  it('runs a split model from the URL of its first shard', async () => {
    const { cp, until } = setup();
    cp.assign({ replicaId: 'split', source: up.url('tiny-00001-of-00002.gguf') });
    expect((await until('split', 'READY')).tokensPerSecond).toBeGreaterThan(0);
    expect(up.requests.filter((r) => r.name === 'tiny-00002-of-00002.gguf')).toHaveLength(1);
  });

  it('fails with the reason: a file that is not a model, one cut short, one changed on the way', async () => {
    const { cp, until, cacheDir } = setup();
    cp.assign({ replicaId: 'bad', source: up.url('not-a-model.gguf') });
    cp.assign({ replicaId: 'cut', source: up.url('cut.gguf') });
    cp.assign({ replicaId: 'tampered', source: up.url('tampered.gguf') });
    expect((await until('bad', 'FAILED')).message).toMatch(/Invalid GGUF magic/);
    expect((await until('cut', 'FAILED')).message).toMatch(/not within the file bounds/);
    expect((await until('tampered', 'FAILED')).message).toMatch(/sha256 is [0-9a-f]{64}, but the mirror says/);
    const files = await fs.readdir(path.join(cacheDir, 'models'));
    expect(files.filter((f) => f.endsWith('.part'))).toEqual([]);
    // A failed replica is not retried at every poll.
    const before = cp.replicaReports.length;
    await new Promise((r) => setTimeout(r, 50));
    expect(cp.replicaReports.length).toBe(before);
  });

  it('sends a report again when the control plane was down, and confirms STOP for what it never ran', async () => {
    const { cp, until } = setup();
    cp.dropReports = 3;
    cp.assign({ replicaId: 'r2', source: up.url('tiny.gguf') });
    cp.assign({ replicaId: 'gone', source: up.url('tiny.gguf'), desired: 'STOP' });
    await until('r2', 'READY');
    expect((await until('gone', 'STOPPED')).message).toBe('not running on this node');
    expect(cp.states('gone')).toEqual(['STOPPED']);
  });

  it('stops and reports every running replica on shutdown', async () => {
    const { cp, runner, until } = setup();
    cp.assign({ replicaId: 'r3', source: up.url('tiny.gguf') });
    await until('r3', 'READY');
    await runner.stopAll();
    expect(cp.last('r3')).toMatchObject({ state: 'STOPPED', message: 'stopped: the node agent was shut down' });
  });

  it('acts on a pushed list at once, and a poll answered after it does not undo it', async () => {
    // The control plane pushes (as GraphqlControlPlane does over the agent's channel). The runner's first poll
    // is held until after a push that places r4: it then answers the list from before the placement.
    const cp = new FakeControlPlane();
    let to: PushedAssignments | undefined;
    let answer: (() => void) | undefined;
    const held = new Promise<void>((r) => {
      answer = r;
    });
    let polls = 0;
    const pushing: ControlPlane = {
      reportNode: (r) => cp.reportNode(r),
      reportReplica: (r) => cp.reportReplica(r),
      assignments: async () => {
        const before = await cp.assignments();
        if (polls++ === 0) await held;
        return before;
      },
      pushed: (t) => {
        to = t;
        return () => {};
      },
    };
    const runner = new Runner({
      controlPlane: pushing,
      cache: new ModelCache(path.join(dir, `cache-${++caches}`), { backoffMs: 10 }),
      runtime: async () => runtime,
      vllmCommand: async () => null,
      baseUrl: 'http://hangar.invalid',
      log: createLogger('silent'),
      pollMs: 60_000,
    });
    runners.push(runner);
    runner.start();
    cp.assign({ replicaId: 'r4', source: up.url('tiny.gguf') });
    to?.onList(await cp.assignments());
    answer?.();
    const deadline = Date.now() + 20_000;
    while (cp.last('r4')?.state !== 'READY') {
      if (Date.now() > deadline) throw new Error(`r4 is ${JSON.stringify(cp.states('r4'))}, not READY, after 20 s`);
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(cp.states('r4')).not.toContain('STOPPED');
    // Pushed, it is not polled again within the interval: one poll, the one held.
    expect(polls).toBe(1);
  });

  it('reports vLLM missing', async () => {
    // Running one (port, key, probe, failure, stop) is in engines/external.test.ts, against a stand-in engine.
    const missing = setup();
    missing.cp.assign({ replicaId: 'v0', source: 'org/model', engine: 'vllm' });
    expect((await missing.until('v0', 'FAILED')).message).toMatch(/^vLLM is not installed on this node/);
  });
});
