import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { packDirectory, readPeftTar } from '@hangar/common/peft/peft-tar';
import { writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import type { Llama, LlamaModel } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cpuLlama, logitsAt, maxDiff, promptTokens } from '../../test/fixtures/llama-lora.js';

// The adapter in packages/common/test/fixtures/peft-h200/ is what packages/agent/trainer/train_lora.py wrote on an NVIDIA H200 (torch
// 2.11, transformers 5.17, peft 0.21.0; packages/agent/trainer/device-check.sh, 2026-11-30): rank 8, alpha 16, 3 epochs
// on 64 pairs, on a random Llama with the tiny test model's shapes. trainer.stdout.jsonl is that run's protocol
// output. CI has no GPU, so this is how real PEFT output, not only our own writer's, stays covered: it goes
// through the same path as an upload (tar → checks → GGUF) and must load and act in real llama.cpp.

const FIXTURE = new URL('../../../packages/common/test/fixtures/peft-h200/', import.meta.url).pathname;

describe('the adapter the real trainer made on a GPU', () => {
  let llama: Llama;
  let base: LlamaModel;
  let dir: string;
  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-real-peft-'));
    llama = await cpuLlama();
    base = await llama.loadModel({ modelPath: (await writeTinyLlama(dir)).file });
  });
  afterAll(async () => {
    await base?.dispose();
    await llama?.dispose();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('spoke the trainer protocol and its loss went down', async () => {
    const lines = (await fs.readFile(path.join(FIXTURE, 'trainer.stdout.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines[0]).toEqual({ event: 'start', steps: 48 });
    expect(lines.at(-1)).toEqual({ event: 'done' });
    const steps = lines.filter((l) => l.event === 'step');
    expect(steps.map((s) => s.step)).toEqual(Array.from({ length: 48 }, (_, i) => i + 1));
    expect(steps.at(-1).loss).toBeLessThan(steps[0].loss);
    expect(steps.every((s) => s.peak_mib > 0)).toBe(true);
  });

  it('passes the upload checks, becomes a GGUF adapter, and changes llama.cpp output only at scale 1', async () => {
    const work = await fs.mkdtemp(path.join(dir, 'upload-'));
    for (const f of ['adapter_config.json', 'adapter_model.safetensors'])
      await fs.copyFile(path.join(FIXTURE, f), path.join(work, f));
    const contents = await readPeftTar(packDirectory(work));
    expect(contents.files.map((f) => f.name).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    const gguf = peftToGguf({
      config: contents.config,
      safetensors: contents.weights,
      base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
    });
    const file = path.join(dir, 'real.gguf');
    await fs.writeFile(file, gguf);
    const prompt = promptTokens(base);
    const plain = await logitsAt(base, prompt);
    const one = await logitsAt(base, prompt, [{ filePath: file, scale: 1 }]);
    const zero = await logitsAt(base, prompt, [{ filePath: file, scale: 0 }]);
    expect(maxDiff(plain, one)).toBeGreaterThan(1e-3);
    expect(maxDiff(plain, zero)).toBeLessThan(1e-5);
  });
});
