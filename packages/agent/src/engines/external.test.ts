import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLogger } from '@hangar/common/log';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FakeControlPlane } from '../../test/fixtures/fake-control-plane.js';
import { ModelCache } from '../model-cache.js';
import { Runner } from '../runner.js';
import { EngineStartError, startExternalEngine } from './external.js';

// The runner with engines as child processes: llama-server and vLLM are played by the stand-in engine (a Node
// script speaking their flags and HTTP protocol over a real socket; neither can be installed here), files come
// from a real HTTP server answering like the mirror, the control plane is the in-memory one.

const STAND_IN = fileURLToPath(new URL('../../test/fixtures/stand-in-engine.mjs', import.meta.url));
const engine = (...flags: string[]) => [process.execPath, STAND_IN, ...flags];

let up: Upstream;
let dir: string;
beforeAll(async () => {
  up = await startUpstream();
  // llama-server is handed the cached file's path; the stand-in does not read it, so any bytes do.
  up.files.set('tiny.gguf', { body: Buffer.from('GGUF stand-in weights') });
  up.files.set('tiny-lora.gguf', { body: Buffer.from('GGUF stand-in adapter') });
  // vLLM's weights and adapters are mirror versions, listed and fetched whole into a directory of the cache.
  publishSet('org-tiny/v1/', { 'config.json': CONFIG, 'model.safetensors': bytes(20_000, 3) });
  publishSet('sql/job-1/', peft(8, 1));
  publishSet('later/job-2/', peft(8, 2));
  publishSet('later/job-3/', peft(8, 3));
  publishSet('wide/job-4/', peft(64, 4));
  // A version with weights and no adapter_config.json: vLLM finds no adapter there.
  publishSet('broken/job-5/', { 'adapter_model.safetensors': bytes(100, 5) });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-external-'));
});

const CONFIG = Buffer.from('{"architectures":["LlamaForCausalLM"],"model_type":"llama"}');
/** A PEFT adapter's files as the trainer publishes them (the stand-in reads only the config's rank). */
const peft = (r: number, seed: number) => ({
  'adapter_config.json': Buffer.from(JSON.stringify({ peft_type: 'LORA', r, lora_alpha: 2 * r })),
  'adapter_model.safetensors': bytes(1000, seed),
});
/** A version as the mirror lists it (GET /mirror/<model>/<version>/) with its files. */
function publishSet(version: string, files: Record<string, Buffer>) {
  for (const [name, body] of Object.entries(files)) up.files.set(`${version}${name}`, { body });
  const listed = Object.entries(files).map(([name, body]) => ({ name, size: body.length, sha256: sha256(body) }));
  up.files.set(version, { body: Buffer.from(JSON.stringify({ complete: true, files: listed })) });
}
/** A version's URL ends in `/`, as the mirror's does (the upstream's url() would escape it). */
const setUrl = (version: string) => `${up.url(version.slice(0, -1))}/`;
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
  it('starts a replica placed on one GPU with that GPU alone visible to the engine', async () => {
    const { cp, until } = setup({ llamaServer: engine() });
    cp.assign({ replicaId: 'gpu1', source: up.url('tiny.gguf'), gpuIndex: 1 });
    const ready = await until('gpu1', 'READY');
    expect(ready.message).toMatch(/^llama-server answers on port \d+ \(pid \d+\) on GPU 1$/);
    const models = await fetch(`${ready.endpoint}/models`, { headers: { authorization: `Bearer ${ready.engineKey}` } });
    const listed = (await models.json()) as { data: { stand_in_cuda_visible_devices: string | null }[] };
    expect(listed.data[0]?.stand_in_cuda_visible_devices).toBe('1');
    // The node as a whole: the engine sees what the agent sees.
    cp.assign({ replicaId: 'whole', source: up.url('tiny.gguf') });
    const whole = await until('whole', 'READY');
    const all = await fetch(`${whole.endpoint}/models`, { headers: { authorization: `Bearer ${whole.engineKey}` } });
    expect(((await all.json()) as typeof listed).data[0]?.stand_in_cuda_visible_devices).toBe(
      process.env.CUDA_VISIBLE_DEVICES ?? null,
    );
  });

  it('starts a model split across two GPUs on those cards alone, told the split: llama-server and vLLM', async () => {
    type Listed = { data: { stand_in_cuda_visible_devices: string | null; stand_in_split: Record<string, unknown> }[] };
    const listed = async (r: { endpoint?: string | null; engineKey?: string | null }) =>
      (
        (await (
          await fetch(`${r.endpoint}/models`, { headers: { authorization: `Bearer ${r.engineKey}` } })
        ).json()) as Listed
      ).data[0];
    const llama = setup({ llamaServer: engine() });
    llama.cp.assign({ replicaId: 'split-llama', source: up.url('tiny.gguf'), gpuIndex: null, gpuIndexes: [2, 3] });
    const ready = await llama.until('split-llama', 'READY');
    expect(ready.message).toMatch(/^llama-server answers on port \d+ \(pid \d+\) on GPU 2,3, split 2 ways$/);
    expect(await listed(ready)).toMatchObject({
      stand_in_cuda_visible_devices: '2,3',
      stand_in_split: { mode: 'layer', tensorSplit: '1,1', tensorParallel: null },
    });

    const vllm = setup({ vllm: engine('serve') });
    vllm.cp.assign({
      replicaId: 'split-vllm',
      model: 'org/tiny',
      engine: 'vllm',
      source: setUrl('org-tiny/v1/'),
      gpuIndexes: [0, 1, 2, 3],
      // Placement booked 15 % of each card: vLLM must not take its default 90 %.
      gpuMemoryFraction: 0.15,
    });
    const tp = await vllm.until('split-vllm', 'READY');
    expect(tp.message).toContain('on GPU 0,1,2,3, split 4 ways');
    expect(await listed(tp)).toMatchObject({
      stand_in_cuda_visible_devices: '0,1,2,3',
      stand_in_split: { tensorParallel: 4, gpuMemoryUtilization: 0.15 },
    });
  });

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

  it('runs vLLM on a verified local copy of the mirror version, under the model name with its key', async () => {
    const { cp, until } = setup({ vllm: engine('serve') });
    cp.assign({
      replicaId: 'v1',
      model: 'org/tiny',
      engine: 'vllm',
      source: setUrl('org-tiny/v1/'),
      adapters: [{ name: 'sql', source: setUrl('sql/job-1/') }],
    });
    const ready = await until('v1', 'READY');
    // Not asserted: the LOADING report "fetching the weights from the mirror". Reports coalesce (the latest state
    // wins while one is in flight), so on a loaded machine it is overtaken by "starting vLLM"; the cache directory
    // checked below is what shows the weights came from the mirror.
    expect(ready.message).toMatch(/^vllm answers on port \d+ \(pid \d+\); adapters: sql$/);
    expect(ready.adapters).toEqual(['sql']);
    const client = new OpenAI({ baseURL: ready.endpoint!, apiKey: ready.engineKey!, maxRetries: 0 });
    const models = (await client.models.list()).data as (OpenAI.Model & { root: string })[];
    expect(models.map((m) => m.id)).toEqual(['org/tiny', 'sql']);
    // What vLLM was given: a directory on this node holding the version's files, byte for byte.
    const weights = models[0]!.root;
    expect(weights.startsWith(path.join(dir, 'cache-'))).toBe(true);
    expect(await fs.readFile(path.join(weights, 'config.json'))).toEqual(CONFIG);
    expect(sha256(await fs.readFile(path.join(weights, 'model.safetensors')))).toBe(sha256(bytes(20_000, 3)));
    expect(JSON.parse(await fs.readFile(path.join(models[1]!.root, 'adapter_config.json'), 'utf8')).r).toBe(8);
    const viaAdapter = await client.chat.completions.create({
      model: 'sql',
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(viaAdapter.choices[0]?.message.content).toBe('stand-in vllm model=org/tiny adapter=sql');
    await expect(
      new OpenAI({ baseURL: ready.endpoint!, apiKey: 'wrong', maxRetries: 0 }).models.list(),
    ).rejects.toMatchObject({ status: 401 });
  });

  it('loads an adapter published after vLLM started with its runtime API, unloads one withdrawn, refuses a bad one by name', async () => {
    const { cp, runner, until } = setup({ vllm: engine('serve') });
    const assign = (...adapters: [string, string][]) =>
      cp.assign({
        replicaId: 'v2',
        model: 'org/tiny',
        engine: 'vllm',
        source: setUrl('org-tiny/v1/'),
        adapters: adapters.map(([name, version]) => ({ name, source: setUrl(version) })),
      });
    assign();
    const ready = await until('v2', 'READY');
    expect(ready.adapters).toEqual([]);
    const client = new OpenAI({ baseURL: ready.endpoint!, apiKey: ready.engineKey!, maxRetries: 0 });
    const ask = async (model: string) =>
      (await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] })).choices[0]?.message
        .content;
    const roots = async () =>
      Object.fromEntries(
        ((await client.models.list()).data as (OpenAI.Model & { root: string })[]).map((m) => [m.id, m.root]),
      );
    const reported = async (check: (adapters: string[], message: string) => boolean) => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const last = cp.last('v2');
        if (last && check(last.adapters ?? [], last.message ?? '')) return last;
        if (Date.now() > deadline) throw new Error(`the last report is ${JSON.stringify(last)} after 20 s`);
        await runner.poll();
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    await expect(ask('sql')).rejects.toMatchObject({ status: 404 });

    // Published while it runs: fetched whole, loaded with POST /v1/load_lora_adapter, reported, answered.
    assign(['sql', 'sql/job-1/'], ['later', 'later/job-2/']);
    let last = await reported((a) => a.length === 2);
    expect(last).toMatchObject({ state: 'READY', adapters: ['sql', 'later'] });
    expect(last.message).toMatch(/^vllm answers on port \d+ \(pid \d+\); adapters: sql, later$/);
    expect(await ask('later')).toBe('stand-in vllm model=org/tiny adapter=later');
    const first = (await roots()).later;

    // Published again from another version: unloaded, then loaded from the new directory under the same name.
    assign(['sql', 'sql/job-1/'], ['later', 'later/job-3/']);
    await reported(() => true);
    const deadline = Date.now() + 20_000;
    while ((await roots()).later === first || !(await roots()).later) {
      if (Date.now() > deadline) throw new Error('later was not loaded again from its new version');
      await runner.poll();
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(JSON.parse(await fs.readFile(path.join((await roots()).later!, 'adapter_config.json'), 'utf8'))).toEqual(
      JSON.parse(peft(8, 3)['adapter_config.json'].toString()),
    );

    // Withdrawn: unloaded, no longer answered, no longer reported. A broken one and one above vLLM's
    // --max-lora-rank are refused by name with vLLM's words; the base and the others keep serving.
    assign(['later', 'later/job-3/'], ['broken', 'broken/job-5/'], ['wide', 'wide/job-4/']);
    last = await reported((a, m) => !a.includes('sql') && /"wide"/.test(m) && /"broken"/.test(m));
    expect(last.adapters).toEqual(['later']);
    expect(last.message).toMatch(
      /adapter "broken" was refused by vLLM \(HTTP 404\): Loading lora broken failed: No adapter found for \S+/,
    );
    expect(last.message).toMatch(
      /adapter "wide" was refused by vLLM \(HTTP 400\): LoRA rank 64 is greater than max_lora_rank 16\./,
    );
    await expect(ask('sql')).rejects.toMatchObject({ status: 404 });
    expect(Object.keys(await roots())).toEqual(['org/tiny', 'later']);
    expect(await ask('org/tiny')).toBe('stand-in vllm model=org/tiny adapter=none');
    expect(await ask('later')).toBe('stand-in vllm model=org/tiny adapter=later');
  });

  it('starts vLLM with a rank that fits its adapters, and without LoRA when the model has none', async () => {
    const wide = setup({ vllm: engine('serve') });
    wide.cp.assign({
      replicaId: 'v3',
      model: 'org/tiny',
      engine: 'vllm',
      source: setUrl('org-tiny/v1/'),
      adapters: [{ name: 'wide', source: setUrl('wide/job-4/') }],
    });
    const started = await wide.until('v3', 'READY');
    expect(started.adapters).toEqual(['wide']);
    const pid = Number(started.message?.match(/pid (\d+)/)?.[1]);
    expect((await fs.readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0')).toEqual(
      // Prefix caching on: a conversation kept on this replica by the gateway is not computed again.
      expect.arrayContaining(['--enable-lora', '--max-lora-rank', '64', '--enable-prefix-caching']),
    );

    const none = setup({ vllm: engine('serve', '--stand-in-no-lora') });
    none.cp.assign({
      replicaId: 'v4',
      model: 'org/tiny',
      engine: 'vllm',
      source: setUrl('org-tiny/v1/'),
      adapters: [{ name: 'sql', source: setUrl('sql/job-1/') }],
    });
    const base = await none.until('v4', 'READY');
    expect(base.adapters).toEqual([]);
    expect(base.message).toMatch(
      /; adapters "sql" are not served: vLLM would not start with LoRA enabled for this model \(.*does not support LoRA yet\.\), so it serves the base model alone$/,
    );
  });

  it('gives vLLM no URL: a source that is not a mirror version fails, and vLLM itself refuses a non-directory', async () => {
    const { cp, until } = setup({ vllm: engine('serve') });
    cp.assign({ replicaId: 'url', engine: 'vllm', source: up.url('tiny.gguf') });
    expect((await until('url', 'FAILED')).message).toMatch(
      /is not a mirror version \(…\/mirror\/<model>\/<version>\/\)/,
    );
    // The stand-in refuses what vLLM refuses: weights that are not a local directory.
    const refused = await startExternalEngine({
      kind: 'vllm',
      command: engine('serve'),
      args: [setUrl('org-tiny/v1/'), '--served-model-name', 'org/tiny'],
      host: '127.0.0.1',
      key: 'k'.repeat(32),
      readyMs: 10_000,
      graceMs: 1000,
      probeMs: 50,
    }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(EngineStartError);
    expect((refused as EngineStartError).message).toMatch(/is not a local folder and is not a valid model identifier/);
  });

  it('fails with the engine’s last lines when it exits at start, and at the deadline when it never answers', async () => {
    const { cp, until } = setup({
      llamaServer: engine('--stand-in-exit-at-start'),
      vllm: engine('serve', '--stand-in-never-ready'),
      readyMs: 1500,
    });
    cp.assign({ replicaId: 'dies', source: up.url('tiny.gguf') });
    cp.assign({ replicaId: 'hangs', engine: 'vllm', source: setUrl('org-tiny/v1/') });
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
