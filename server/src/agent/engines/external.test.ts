import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeControlPlane } from '../../../test/fixtures/fake-control-plane.js';
import { startUpstream, type Upstream } from '../../../test/fixtures/fault-upstream.js';
import { createLogger } from '../../lib/log.js';
import { ModelCache } from '../model-cache.js';
import { Runner } from '../runner.js';

// The runner with engines as child processes: llama-server and vLLM are played by the stand-in engine (a Node
// script speaking their flags and HTTP protocol over a real socket; neither can be installed here), files come
// from a real HTTP server answering like the mirror, the control plane is the in-memory one.

const STAND_IN = fileURLToPath(new URL('../../../test/fixtures/stand-in-engine.mjs', import.meta.url));
const engine = (...flags: string[]) => [process.execPath, STAND_IN, ...flags];

let up: Upstream;
let dir: string;
beforeAll(async () => {
  up = await startUpstream();
  // llama-server is handed the cached file's path; the stand-in does not read it, so any bytes do.
  up.files.set('tiny.gguf', { body: Buffer.from('GGUF stand-in weights') });
  up.files.set('tiny-lora.gguf', { body: Buffer.from('GGUF stand-in adapter') });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-external-'));
});
afterAll(async () => {
  await up.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const runners: Runner[] = [];
afterEach(async () => {
  await Promise.all(runners.splice(0).map((r) => r.stopAll(100)));
});

let caches = 0;
function setup(o: { llamaServer?: string[]; vllm?: string[]; readyMs?: number }) {
  const cp = new FakeControlPlane();
  const runner = new Runner({
    controlPlane: cp,
    cache: new ModelCache(path.join(dir, `cache-${++caches}`), { backoffMs: 10 }),
    runtime: async () => {
      throw new Error('the embedded runtime is not used when llama-server is configured');
    },
    vllmCommand: async () => o.vllm ?? null,
    baseUrl: 'http://hangar.invalid',
    log: createLogger('silent'),
    external: {
      host: '127.0.0.1',
      llamaServer: o.llamaServer,
      readyMs: o.readyMs ?? 20_000,
      graceMs: 2000,
      probeMs: 50,
    },
  });
  runners.push(runner);
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
  return { cp, runner, until };
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('external engines', () => {
  it('runs llama-server on a port it assigns with a key it makes, READY once /health answers, stopped on STOP', async () => {
    const { cp, runner, until } = setup({ llamaServer: engine('--stand-in-load-ms', '300') });
    cp.assign({
      replicaId: 'ls1',
      source: up.url('tiny.gguf'),
      adapters: [{ name: 'tiny-lora', source: up.url('tiny-lora.gguf') }],
    });
    const ready = await until('ls1', 'READY');
    expect(cp.states('ls1')).toContain('LOADING');
    expect(ready.endpoint).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    expect(ready.engineKey).toMatch(/\S{20,}/);
    expect(ready.message).toMatch(/^llama-server answers on port \d+ \(pid \d+\); adapters: tiny-lora \(lora id 0\)$/);
    expect(ready.adapters).toEqual(['tiny-lora']);
    // The key travels in the report's own field, never in words someone reads.
    for (const r of cp.replicaReports) expect(r.message ?? '').not.toContain(ready.engineKey);

    const client = new OpenAI({ baseURL: ready.endpoint!, apiKey: ready.engineKey!, maxRetries: 0 });
    const base = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] });
    expect(base.choices[0]?.message.content).toMatch(/^stand-in llama-server model=\S+\.gguf adapter=none$/);
    // llama-server applies an adapter loaded with --lora when a request asks for it by id.
    const withAdapter = (await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      // @ts-expect-error llama-server's own field, not in OpenAI's types
      lora: [{ id: 0, scale: 1 }],
    })) as OpenAI.ChatCompletion;
    expect(withAdapter.choices[0]?.message.content).toMatch(/adapter=\S+\.gguf$/);

    // Published after it started: llama-server takes adapters at start only, so the message says when it serves
    // it and the report does not claim it.
    cp.assign({
      replicaId: 'ls1',
      source: up.url('tiny.gguf'),
      adapters: [
        { name: 'tiny-lora', source: up.url('tiny-lora.gguf') },
        { name: 'later', source: up.url('tiny-lora.gguf') },
      ],
    });
    await runner.poll();
    expect(cp.last('ls1')).toMatchObject({
      state: 'READY',
      adapters: ['tiny-lora'],
      message: expect.stringMatching(
        /; adapters: tiny-lora \(lora id 0\); adapters "later" were published after it started: it serves them from its next start$/,
      ),
    });

    const stranger = new OpenAI({ baseURL: ready.endpoint!, apiKey: 'not-the-key', maxRetries: 0 });
    await expect(
      stranger.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
    ).rejects.toMatchObject({ status: 401 });

    const pid = Number(ready.message?.match(/pid (\d+)/)?.[1]);
    expect(alive(pid)).toBe(true);
    // Every user of the node can read a command line; the key goes in the engine's environment instead.
    const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8');
    expect(cmdline).toContain('--port');
    expect(cmdline).not.toContain(ready.engineKey);
    cp.desire('ls1', 'STOP');
    expect(await until('ls1', 'STOPPED')).toMatchObject({ message: 'stopped, as the control plane asked' });
    expect(alive(pid)).toBe(false);
    await expect(fetch(`${ready.endpoint}/models`)).rejects.toThrow();
  });

  it('runs vLLM under the model name with its key; READY once /v1/models answers with that key', async () => {
    const { cp, until } = setup({ vllm: engine('serve') });
    cp.assign({
      replicaId: 'v1',
      model: 'org/tiny',
      engine: 'vllm',
      source: '/models/org-tiny',
      adapters: [{ name: 'sql', source: '/adapters/sql' }],
    });
    const ready = await until('v1', 'READY');
    expect(ready.message).toMatch(/^vllm answers on port \d+ \(pid \d+\); adapters as LoRA modules: sql$/);
    expect(ready.adapters).toEqual(['sql']);
    const client = new OpenAI({ baseURL: ready.endpoint!, apiKey: ready.engineKey!, maxRetries: 0 });
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['org/tiny', 'sql']);
    const viaAdapter = await client.chat.completions.create({
      model: 'sql',
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(viaAdapter.choices[0]?.message.content).toBe('stand-in vllm model=org/tiny adapter=sql');
    await expect(
      new OpenAI({ baseURL: ready.endpoint!, apiKey: 'wrong', maxRetries: 0 }).models.list(),
    ).rejects.toMatchObject({ status: 401 });
  });

  it('fails with the engine’s last lines when it exits at start, and at the deadline when it never answers', async () => {
    const { cp, until } = setup({
      llamaServer: engine('--stand-in-exit-at-start'),
      vllm: engine('serve', '--stand-in-never-ready'),
      readyMs: 1500,
    });
    cp.assign({ replicaId: 'dies', source: up.url('tiny.gguf') });
    cp.assign({ replicaId: 'hangs', engine: 'vllm', source: '/models/x' });
    expect((await until('dies', 'FAILED')).message).toMatch(
      /exited with code 1; its last lines: .*tensor data is not within the file bounds \| main: exiting due to model loading error$/,
    );
    const hangs = await until('hangs', 'FAILED');
    expect(hangs.message).toMatch(
      /did not answer GET \/v1\/models with 200 within 2 s \(last: HTTP 503\); it was stopped; its last lines: server listening on 127\.0\.0\.1:(\d+)/,
    );
    // The child is gone: nothing listens on its port any more.
    const port = hangs.message?.match(/127\.0\.0\.1:(\d+)/)?.[1];
    await expect(fetch(`http://127.0.0.1:${port}/health`)).rejects.toThrow();
  });

  it('starts llama-server again without its adapters when it refuses one, naming them and its words', async () => {
    up.files.set('not-a-lora.gguf', { body: Buffer.from('not an adapter at all') });
    const { cp, until } = setup({ llamaServer: engine() });
    cp.assign({
      replicaId: 'ls3',
      source: up.url('tiny.gguf'),
      adapters: [
        { name: 'tiny-lora', source: up.url('tiny-lora.gguf') },
        { name: 'broken', source: up.url('not-a-lora.gguf') },
      ],
    });
    const ready = await until('ls3', 'READY');
    expect(ready.message).toMatch(
      /^llama-server answers on port \d+ \(pid \d+\); adapters "tiny-lora", "broken" were refused \(.*exited with code 1; its last lines: .*failed to load lora adapter\), the base model serves without them$/,
    );
    expect(ready.adapters).toEqual([]);
    const client = new OpenAI({ baseURL: ready.endpoint!, apiKey: ready.engineKey!, maxRetries: 0 });
    const base = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] });
    expect(base.choices[0]?.message.content).toMatch(/adapter=none$/);
  });

  it('reports a ready engine that dies FAILED with its last lines', async () => {
    const { cp, until } = setup({ llamaServer: engine() });
    cp.assign({ replicaId: 'ls2', source: up.url('tiny.gguf') });
    const ready = await until('ls2', 'READY');
    process.kill(Number(ready.message?.match(/pid (\d+)/)?.[1]), 'SIGKILL');
    expect((await until('ls2', 'FAILED')).message).toMatch(/was ended by SIGKILL; its last lines: .*model loaded$/);
  });
});
