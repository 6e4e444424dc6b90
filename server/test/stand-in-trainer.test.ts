import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { readSafetensors, toFloat32 } from '@hangar/common/peft/safetensors';
import { TINY_LLAMA, tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cpuLlama, logitsAt, maxDiff, promptTokens } from './fixtures/llama-lora.js';
import { writeTinyBaseRepo } from './fixtures/tiny-base-repo.js';

// The stand-in trainer as the agent runs it: `node stand-in-trainer.mjs --job job.json --out DIR`, a child process
// speaking JSON lines. What it writes must be a PEFT adapter that converts and loads on the tiny llama, since the
// whole training path downstream of the GPU is tested with it.

const SCRIPT = new URL('./fixtures/stand-in-trainer.mjs', import.meta.url).pathname;

let root: string;
let baseDir: string;
let dataPath: string;
const PAIRS = 10;

beforeAll(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-stand-in-'));
  baseDir = (await writeTinyBaseRepo(await fs.mkdtemp(path.join(root, 'base-')))).dir;
  dataPath = path.join(root, 'data.ndjson');
  const lines = Array.from({ length: PAIRS }, (_, i) => JSON.stringify({ q: `question ${i}?`, a: `answer ${i}.` }));
  await fs.writeFile(dataPath, `${lines.join('\n')}\n`);
});
afterAll(async () => {
  await fs.rm(root, { recursive: true, force: true });
});

type Run = { child: ChildProcess; out: string; lines: Record<string, unknown>[]; exit: Promise<number | null> };

/** Starts the trainer on a job like the agent's (the claim's spec plus the three local paths). */
async function start(o: { params?: Record<string, unknown>; env?: Record<string, string>; data?: string } = {}) {
  const dir = await fs.mkdtemp(path.join(root, 'job-'));
  const out = path.join(dir, 'out');
  await fs.mkdir(out);
  const job = {
    id: 'job-1',
    name: 'support-bot',
    base_repo: 'hangar-test/tiny-llama',
    base_revision: 'main',
    params: { rank: 8, alpha: 16, dropout: 0.05, epochs: 2, lr: 0.0002, batch: 4, max_len: 256, seed: 7, ...o.params },
    data: { url: 'http://hangar/api/train/jobs/job-1/data', sha256: 'x', bytes: 1, pairs: PAIRS },
    base: { files: [] },
    gguf: true,
    data_path: o.data ?? dataPath,
    base_dir: baseDir,
    out_dir: out,
  };
  const jobFile = path.join(dir, 'job.json');
  await fs.writeFile(jobFile, JSON.stringify(job));
  const child = spawn(process.execPath, [SCRIPT, '--job', jobFile, '--out', out], {
    env: { ...process.env, HANGAR_STAND_IN_STEP_MS: '1', ...o.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Record<string, unknown>[] = [];
  let rest = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    rest += chunk.toString('utf8');
    const parts = rest.split('\n');
    rest = parts.pop() ?? '';
    for (const p of parts) if (p.trim()) lines.push(JSON.parse(p));
  });
  child.stderr!.resume();
  const exit = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return { child, out, lines, exit } satisfies Run;
}

describe('the stand-in trainer', () => {
  it('prints start, a step per batch per epoch with falling loss, then done, and leaves a PEFT adapter', async () => {
    const run = await start();
    expect(await run.exit).toBe(0);
    const steps = Math.ceil(PAIRS / 4) * 2;
    expect(run.lines[0]).toEqual({ event: 'start', steps });
    const points = run.lines.slice(1, -1);
    expect(points.map((p) => p.step)).toEqual(Array.from({ length: steps }, (_, i) => i + 1));
    for (const p of points) {
      expect(Object.keys(p).sort()).toEqual(['event', 'loss', 'lr', 'peak_mib', 'step', 'tokens_per_s']);
      expect(p.event).toBe('step');
      expect(Number.isInteger(p.peak_mib) && (p.peak_mib as number) > 0).toBe(true);
      expect(p.tokens_per_s as number).toBeGreaterThan(0);
      expect(p.lr as number).toBeGreaterThanOrEqual(0);
    }
    const losses = points.map((p) => p.loss as number);
    for (let i = 1; i < losses.length; i++) expect(losses[i]!).toBeLessThan(losses[i - 1]!);
    expect(run.lines.at(-1)).toEqual({ event: 'done' });

    expect((await fs.readdir(run.out)).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    const config = JSON.parse(await fs.readFile(path.join(run.out, 'adapter_config.json'), 'utf8'));
    expect(config).toMatchObject({
      peft_type: 'LORA',
      task_type: 'CAUSAL_LM',
      r: 8,
      lora_alpha: 16,
      lora_dropout: 0.05,
      base_model_name_or_path: 'hangar-test/tiny-llama',
      target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
      bias: 'none',
      use_dora: false,
      use_rslora: false,
      fan_in_fan_out: false,
      modules_to_save: null,
    });
    const st = readSafetensors(await fs.readFile(path.join(run.out, 'adapter_model.safetensors')));
    expect(st.tensors.size).toBe(TINY_LLAMA.layers * 7 * 2);
    const t = (k: string) => st.tensors.get(`base_model.model.model.layers.1.${k}`)!;
    expect(t('self_attn.k_proj.lora_A.weight')).toMatchObject({ dtype: 'F32', shape: [8, 64] });
    expect(t('mlp.down_proj.lora_A.weight').shape).toEqual([8, TINY_LLAMA.ff]);
    expect(t('mlp.gate_proj.lora_B.weight').shape).toEqual([TINY_LLAMA.ff, 8]);
    // Unlike PEFT's initial B, non-zero: the adapter has to change what the model says.
    expect(toFloat32(t('self_attn.q_proj.lora_B.weight')).some((v) => v !== 0)).toBe(true);
  });

  it('writes the same adapter for the same seed and another for another seed', async () => {
    const read = async (seed: number) => {
      const run = await start({ params: { seed, epochs: 1 } });
      expect(await run.exit).toBe(0);
      return fs.readFile(path.join(run.out, 'adapter_model.safetensors'));
    };
    const [a, b, c] = await Promise.all([read(1), read(1), read(2)]);
    expect(a.equals(b)).toBe(true);
    expect(a.equals(c)).toBe(false);
  });

  it('stops promptly on SIGTERM, exits non-zero and writes nothing', async () => {
    const run = await start({ env: { HANGAR_STAND_IN_STEP_MS: '200' }, params: { epochs: 50 } });
    while (!run.lines.some((l) => l.event === 'step')) await new Promise((r) => setTimeout(r, 10));
    const sent = Date.now();
    run.child.kill('SIGTERM');
    const code = await run.exit;
    expect(Date.now() - sent).toBeLessThan(1000);
    expect(code).not.toBe(0);
    expect(code).not.toBeNull();
    expect(run.lines.some((l) => l.event === 'done')).toBe(false);
    expect(await fs.readdir(run.out)).toEqual([]);
  });

  it('fails at the step HANGAR_STAND_IN_FAIL_AT_STEP names, with an error event and exit 1', async () => {
    const run = await start({ env: { HANGAR_STAND_IN_FAIL_AT_STEP: '3' } });
    expect(await run.exit).toBe(1);
    expect(run.lines.map((l) => l.event)).toEqual(['start', 'step', 'step', 'error']);
    expect(run.lines.at(-1)?.message).toMatch(/step 3/);
    expect(await fs.readdir(run.out)).toEqual([]);
  });

  it('fails with the reason when the data has a line that is not a pair', async () => {
    const bad = path.join(root, 'bad.ndjson');
    await fs.writeFile(bad, '{"q":"a","a":"b"}\nnot json\n');
    const run = await start({ data: bad });
    expect(await run.exit).toBe(1);
    expect(run.lines).toEqual([{ event: 'error', message: 'data line 2 is not a {"q","a"} pair' }]);
  });
});

describe("the stand-in trainer's adapter in llama.cpp", () => {
  it('converts to a GGUF adapter that loads on the tiny llama and changes its output', async () => {
    const run = await start();
    expect(await run.exit).toBe(0);
    const gguf = peftToGguf({
      config: JSON.parse(await fs.readFile(path.join(run.out, 'adapter_config.json'), 'utf8')),
      safetensors: await fs.readFile(path.join(run.out, 'adapter_model.safetensors')),
      base: { architecture: 'llama', headCount: TINY_LLAMA.heads, headCountKv: TINY_LLAMA.kvHeads },
    });
    const adapter = path.join(run.out, '..', 'adapter.gguf');
    await fs.writeFile(adapter, gguf);
    const modelPath = path.join(root, 'tiny.gguf');
    await fs.writeFile(modelPath, tinyLlama());

    const llama = await cpuLlama();
    const model = await llama.loadModel({ modelPath });
    try {
      const prompt = promptTokens(model);
      const moved = maxDiff(await logitsAt(model, prompt), await logitsAt(model, prompt, [{ filePath: adapter }]));
      console.info(`stand-in adapter: logits move by up to ${moved.toFixed(4)}`);
      expect(moved).toBeGreaterThan(0.01);
    } finally {
      await model.dispose();
      await llama.dispose();
    }
  });
});

describe('the tiny base repository', () => {
  it('is the tiny llama GGUF in HF layout: its config, Llama names, [out, in] shapes, q/k in HF row order', async () => {
    const config = JSON.parse(await fs.readFile(path.join(baseDir, 'config.json'), 'utf8'));
    expect(config).toMatchObject({
      architectures: ['LlamaForCausalLM'],
      model_type: 'llama',
      hidden_size: TINY_LLAMA.embd,
      intermediate_size: TINY_LLAMA.ff,
      num_hidden_layers: TINY_LLAMA.layers,
      num_attention_heads: TINY_LLAMA.heads,
      num_key_value_heads: TINY_LLAMA.kvHeads,
      vocab_size: 32000,
      max_position_embeddings: 512,
      rms_norm_eps: 1e-5,
      torch_dtype: 'float32',
    });
    expect(JSON.parse(await fs.readFile(path.join(baseDir, 'tokenizer_config.json'), 'utf8'))).toMatchObject({
      tokenizer_class: 'LlamaTokenizer',
    });
    const st = readSafetensors(await fs.readFile(path.join(baseDir, 'model.safetensors')));
    const shapes = Object.fromEntries([...st.tensors].map(([k, t]) => [k, t.shape]));
    expect(Object.keys(shapes)).toHaveLength(2 + 9 * TINY_LLAMA.layers + 1);
    expect(shapes).toMatchObject({
      'model.embed_tokens.weight': [32000, 64],
      'model.layers.0.input_layernorm.weight': [64],
      'model.layers.0.self_attn.q_proj.weight': [64, 64],
      'model.layers.1.mlp.gate_proj.weight': [128, 64],
      'model.layers.1.mlp.down_proj.weight': [64, 128],
      'model.layers.1.post_attention_layernorm.weight': [64],
      'model.norm.weight': [64],
      'lm_head.weight': [32000, 64],
    });

    // llama's converter turns HF row (head, t, j) into GGUF row (head, j, t) of [h, 2, rows/2h]: check it maps back.
    const gguf = new Map<string, Float32Array>();
    tinyLlama({ edit: (name, _ne, data) => gguf.set(name, data.slice()) });
    const hfQ = toFloat32(st.tensors.get('model.layers.0.self_attn.q_proj.weight')!);
    const ggufQ = gguf.get('blk.0.attn_q.weight')!;
    const perHead = 64 / TINY_LLAMA.heads;
    const fromHf = new Float32Array(hfQ.length);
    for (let row = 0; row < 64; row++) {
      const head = Math.floor(row / perHead);
      const j = Math.floor((row % perHead) / 2);
      const from = head * perHead + (row % 2) * (perHead / 2) + j;
      fromHf.set(hfQ.subarray(from * 64, from * 64 + 64), row * 64);
    }
    const bytes = (f: Float32Array) => Buffer.from(f.buffer, f.byteOffset, f.byteLength);
    expect(bytes(fromHf).equals(bytes(ggufQ))).toBe(true);
    expect(bytes(fromHf).equals(bytes(hfQ))).toBe(false);
    // Byte comparisons: a deep equal of two million floats takes seconds.
    expect(bytes(toFloat32(st.tensors.get('lm_head.weight')!)).equals(bytes(gguf.get('output.weight')!))).toBe(true);
  });
});
