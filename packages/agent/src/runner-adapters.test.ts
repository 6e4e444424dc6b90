import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { writeAdapterDir } from '@hangar/common/test/fixtures/adapter-dir';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { openAiClient } from '@hangar/common/test/fixtures/openai-client';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeControlPlane } from '../test/fixtures/fake-control-plane.js';
import type { ReplicaReport } from './control-plane.js';
import { LlamaRuntime } from './llama-runtime.js';
import { ModelCache } from './model-cache.js';
import { createOpenAiServer, type OpenAiServer } from './openai/http.js';
import { Runner } from './runner.js';

// Publishing an adapter makes it callable without restarting anything: a READY replica of real llama.cpp (the
// tiny random llama) follows its assignment's adapters at each poll, and is called on the agent's own endpoint
// with the official `openai` client and the engine key it reported, as the gateway calls it. The adapters are
// real GGUF LoRA files (random PEFT weights converted by the server's converter) served by a mirror-like HTTP
// server, so each is fetched and verified through the model cache as at launch.

const PROMPT = 'The quick brown fox jumps over the lazy dog again';

let up: Upstream;
let dir: string;
let runtime: LlamaRuntime;

async function loraGguf(seed: number) {
  const from = await writeAdapterDir({ seed });
  try {
    return peftToGguf({
      config: JSON.parse(await fs.readFile(path.join(from, 'adapter_config.json'), 'utf8')),
      safetensors: await fs.readFile(path.join(from, 'adapter_model.safetensors')),
      base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
    });
  } finally {
    await fs.rm(from, { recursive: true, force: true });
  }
}

beforeAll(async () => {
  up = await startUpstream();
  up.files.set('tiny.gguf', { body: tinyLlama() });
  up.files.set('lora-a.gguf', { body: await loraGguf(7) });
  up.files.set('lora-b.gguf', { body: await loraGguf(11) });
  up.files.set('lora-a-v2.gguf', { body: await loraGguf(23) });
  // Served and verified like any file (its sha256 matches), and no adapter: llama.cpp refuses it.
  up.files.set('broken.gguf', { body: bytes(4096, 5) });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-runner-adapters-'));
  runtime = await LlamaRuntime.create({ threads: 1 });
});
afterAll(async () => {
  await runtime?.dispose(500);
  await up?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const open: { runner: Runner; http: OpenAiServer }[] = [];
afterEach(async () => {
  for (const o of open.splice(0)) {
    await o.runner.stopAll(100);
    await o.http.close();
  }
});

let caches = 0;
async function setup(o: { adapterFetchRetryMs?: number } = {}) {
  const cp = new FakeControlPlane();
  const http = createOpenAiServer({ log: createLogger('silent') });
  const url = await http.listen({ host: '127.0.0.1', port: 0 });
  const runner = new Runner({
    controlPlane: cp,
    cache: new ModelCache(path.join(dir, `cache-${++caches}`), { backoffMs: 10 }),
    runtime: async () => runtime,
    vllmCommand: async () => null,
    baseUrl: 'http://hangar.invalid',
    log: createLogger('silent'),
    serving: { http, endpoint: () => `${url}/v1` },
    adapterFetchRetryMs: o.adapterFetchRetryMs,
  });
  open.push({ runner, http });
  /** Polls as the timer would until the replica's latest report satisfies `check`. */
  const until = async (replicaId: string, check: (r: ReplicaReport) => boolean, what: string) => {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const last = cp.last(replicaId);
      if (last && check(last)) return last;
      if (Date.now() > deadline) throw new Error(`${what}: the last report is ${JSON.stringify(last)} after 20 s`);
      await runner.poll();
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  /** The replica READY, and the official client on its endpoint with the engine key it reported. */
  const ready = async (replicaId: string) => {
    const r = await until(replicaId, (x) => x.state === 'READY', 'READY');
    expect(r.endpoint).toBe(`${url}/v1`);
    return { report: r, client: openAiClient(r.endpoint ?? '', r.engineKey ?? '') };
  };
  return { cp, runner, until, ready };
}

const complete = async (client: OpenAI, model: string) =>
  (await client.completions.create({ model, prompt: PROMPT, max_tokens: 12, temperature: 0 })).choices[0]?.text;
const listed = async (client: OpenAI) => (await client.models.list()).data.map((m) => m.id).sort();
const adapter = (name: string, file: string) => ({ name, source: up.url(file) });

describe('a READY replica follows its adapters without restarting', () => {
  it('loads an adapter published after it started, answers for it and reports it; unloads one withdrawn', async () => {
    const { cp, until, ready } = await setup();
    cp.assign({ replicaId: 'r', source: up.url('tiny.gguf') });
    const { report: first, client } = await ready('r');
    expect(first.adapters).toEqual([]);
    const base = await complete(client, 'tiny');
    await expect(complete(client, 'tiny-a')).rejects.toMatchObject({ status: 404, code: 'model_not_found' });

    cp.assign({ replicaId: 'r', source: up.url('tiny.gguf'), adapters: [adapter('tiny-a', 'lora-a.gguf')] });
    const loaded = await until('r', (x) => x.adapters?.includes('tiny-a') === true, 'tiny-a reported');
    expect(loaded).toMatchObject({ state: 'READY', adapters: ['tiny-a'], endpoint: first.endpoint });
    expect(loaded.message).toMatch(/; adapters: tiny-a \(\d+ tokens\)$/);
    // The same replica, not a new one: never LOADING again, the same key opens it.
    const states = cp.states('r');
    expect(states.slice(states.indexOf('READY')).every((s) => s === 'READY')).toBe(true);
    expect(loaded.engineKey).toBe(first.engineKey);
    const tuned = await complete(client, 'tiny-a');
    expect(tuned).not.toBe(base);
    expect(await listed(client)).toEqual(['tiny', 'tiny-a']);
    expect(up.requests.filter((r) => r.name === 'lora-a.gguf').length).toBeGreaterThan(0);

    // Withdrawn while a request for it streams: that request ends whole, then the adapter goes.
    const stream = await client.completions.create({
      model: 'tiny-a',
      prompt: PROMPT,
      max_tokens: 300,
      temperature: 0,
      stream: true,
    });
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    cp.assign({ replicaId: 'r', source: up.url('tiny.gguf'), adapters: [] });
    const gone = await until('r', (x) => x.adapters?.length === 0, 'tiny-a no longer reported');
    expect(gone.message).not.toMatch(/adapters/);
    let finish: string | null | undefined;
    for (let next = await iterator.next(); !next.done; next = await iterator.next())
      finish = next.value.choices[0]?.finish_reason ?? finish;
    expect(finish).toBe('length');
    const refused = await complete(client, 'tiny-a').catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.NotFoundError);
    expect(refused).toMatchObject({ status: 404, code: 'model_not_found', param: 'model' });
    expect(await listed(client)).toEqual(['tiny']);
    expect(await complete(client, 'tiny')).toBe(base);
  });

  it('refuses a broken adapter by name and keeps the base and the other adapters serving', async () => {
    const { cp, runner, until, ready } = await setup();
    cp.assign({ replicaId: 'b', source: up.url('tiny.gguf'), adapters: [adapter('tiny-a', 'lora-a.gguf')] });
    const { client } = await ready('b');
    const before = await complete(client, 'tiny-a');

    cp.assign({
      replicaId: 'b',
      source: up.url('tiny.gguf'),
      adapters: [adapter('tiny-a', 'lora-a.gguf'), adapter('broken', 'broken.gguf'), adapter('tiny-b', 'lora-b.gguf')],
    });
    const synced = await until('b', (x) => x.adapters?.includes('tiny-b') === true, 'tiny-b reported');
    expect(synced.state).toBe('READY');
    expect(synced.adapters?.sort()).toEqual(['tiny-a', 'tiny-b']);
    expect(synced.message).toMatch(
      /; adapters: tiny-a \(\d+ tokens\), adapter "broken" did not load on tiny: .+; the base model keeps serving, tiny-b \(\d+ tokens\)$/,
    );
    expect(await complete(client, 'tiny-a')).toBe(before);
    expect(await complete(client, 'tiny-b')).not.toBe(before);
    await expect(complete(client, 'broken')).rejects.toMatchObject({ status: 404, code: 'model_not_found' });

    // Refused once, not loaded again at every poll: nothing more is fetched or reported until it changes.
    const fetched = up.requests.filter((r) => r.name === 'broken.gguf').length;
    const reports = cp.replicaReports.length;
    for (let i = 0; i < 3; i++) await runner.poll();
    await new Promise((r) => setTimeout(r, 50));
    expect(up.requests.filter((r) => r.name === 'broken.gguf').length).toBe(fetched);
    expect(cp.replicaReports.length).toBe(reports);
  });

  it('replaces an adapter published again from another file, under the same name', async () => {
    const { cp, until, ready } = await setup();
    cp.assign({ replicaId: 'p', source: up.url('tiny.gguf'), adapters: [adapter('tiny-a', 'lora-a.gguf')] });
    const { client } = await ready('p');
    const v1 = await complete(client, 'tiny-a');
    const reports = cp.replicaReports.length;

    cp.assign({ replicaId: 'p', source: up.url('tiny.gguf'), adapters: [adapter('tiny-a', 'lora-a-v2.gguf')] });
    await until(
      'p',
      () => cp.replicaReports.slice(reports).some((x) => x.adapters?.length === 0),
      'tiny-a withdrawn while its new file loads',
    );
    const replaced = await until('p', (x) => x.adapters?.includes('tiny-a') === true, 'tiny-a back');
    expect(replaced.state).toBe('READY');
    expect(up.requests.filter((r) => r.name === 'lora-a-v2.gguf').length).toBeGreaterThan(0);
    expect(await complete(client, 'tiny-a')).not.toBe(v1);
  });

  it('tries an adapter the mirror could not give again later, and loads it once it can', async () => {
    const { cp, until, ready } = await setup({ adapterFetchRetryMs: 200 });
    cp.assign({ replicaId: 'm', source: up.url('tiny.gguf') });
    const { client } = await ready('m');
    cp.assign({ replicaId: 'm', source: up.url('tiny.gguf'), adapters: [adapter('late', 'late.gguf')] });
    const missing = await until('m', (x) => /adapter "late" was not fetched/.test(x.message ?? ''), 'late refused');
    expect(missing).toMatchObject({ state: 'READY', adapters: [] });
    expect(missing.message).toMatch(/; adapters: adapter "late" was not fetched: .*; it is tried again in 1 s$/);
    up.files.set('late.gguf', { body: await loraGguf(31) });
    const loaded = await until('m', (x) => x.adapters?.includes('late') === true, 'late loaded on a later poll');
    expect(loaded.message).toMatch(/; adapters: late \(\d+ tokens\)$/);
    expect(await listed(client)).toEqual(['late', 'tiny']);
  });

  it('stops while a withdrawn adapter still answers a request: the request ends whole, then the replica stops', async () => {
    const { cp, until, ready } = await setup();
    cp.assign({ replicaId: 's', source: up.url('tiny.gguf'), adapters: [adapter('tiny-a', 'lora-a.gguf')] });
    const { client } = await ready('s');
    const stream = await client.completions.create({
      model: 'tiny-a',
      prompt: PROMPT,
      max_tokens: 300,
      temperature: 0,
      stream: true,
    });
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next();
    cp.assign({ replicaId: 's', source: up.url('tiny.gguf'), adapters: [] });
    await until('s', (x) => x.adapters?.length === 0, 'tiny-a withdrawn');
    cp.desire('s', 'STOP');
    let finish: string | null | undefined;
    for (let next = await iterator.next(); !next.done; next = await iterator.next())
      finish = next.value.choices[0]?.finish_reason ?? finish;
    expect(finish).toBe('length');
    expect(await until('s', (x) => x.state === 'STOPPED', 'STOPPED')).toMatchObject({
      message: 'stopped, as the control plane asked',
      adapters: [],
    });
  });
});
