import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { VllmEvaluator } from './train-evaluate-vllm.js';

// The vLLM evaluator against the vLLM stand-in (test/fixtures/stand-in-engine.mjs: vLLM's flags, /tokenize and
// /v1/completions with prompt_logprobs over a real socket; its toy model gives every token log-probability -2, and
// -2 less the largest |lora_B| under a LoRA module). The whole flow, from a job to its verdict, is in
// server/test/train-eval.test.ts.

const STAND_IN = fileURLToPath(new URL('../test/fixtures/stand-in-engine.mjs', import.meta.url));
const log = createLogger('silent');
let dir: string;

/** A PEFT adapter whose lora_B tensor holds `b` (F32 safetensors: u64 LE header length, JSON header, data). */
async function adapterDir(rank: number, b: number) {
  const out = path.join(dir, `adapter-${rank}-${b}`);
  await fs.mkdir(out, { recursive: true });
  const data = Buffer.alloc(8 * 4);
  for (let i = 0; i < 8; i++) data.writeFloatLE(i % 2 ? b : -b / 2, i * 4);
  const header = Buffer.from(
    JSON.stringify({
      'base_model.model.layers.0.self_attn.q_proj.lora_B.weight': {
        dtype: 'F32',
        shape: [8, 1],
        data_offsets: [0, 32],
      },
    }),
  );
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(header.length));
  await fs.writeFile(path.join(out, 'adapter_model.safetensors'), Buffer.concat([length, header, data]));
  await fs.writeFile(path.join(out, 'adapter_config.json'), JSON.stringify({ r: rank, lora_alpha: 2 * rank }));
  return out;
}

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-eval-vllm-'));
  await fs.mkdir(path.join(dir, 'base'));
  await fs.writeFile(path.join(dir, 'base', 'config.json'), '{"architectures":["LlamaForCausalLM"]}');
});
afterAll(() => fs.rm(dir, { recursive: true, force: true }));

const questions = [
  { set: 'pairs' as const, q: 'What is the code word for item 1?', a: 'word 1' },
  { set: 'general' as const, q: 'What is the capital of France?', a: 'Paris' },
];

it("answers with the base and the LoRA module, greedily, and reads the reference's log-likelihood from prompt_logprobs", async () => {
  const evaluator = new VllmEvaluator({ command: async () => [process.execPath, STAND_IN, 'serve'], log });
  const progress: number[] = [];
  // Rank 32: above vLLM's default --max-lora-rank (16), which the stand-in, as vLLM, refuses unless raised.
  const answers = await evaluator.answer({
    modelPath: path.join(dir, 'base'),
    adapterPath: await adapterDir(32, 0.5),
    questions,
    maxTokens: 48,
    seed: 7,
    onProgress: (done) => progress.push(done),
  });
  expect(answers).toEqual([
    {
      set: 'pairs',
      question: questions[0]?.q,
      reference: 'word 1',
      baseAnswer: 'stand-in vllm model=evaluated-base adapter=none',
      adapterAnswer: 'stand-in vllm model=evaluated-base adapter=evaluated-adapter',
      baseLogLikelihood: -2,
      adapterLogLikelihood: -2.5,
    },
    expect.objectContaining({ set: 'general', reference: 'Paris', baseLogLikelihood: -2, adapterLogLikelihood: -2.5 }),
  ]);
  expect(progress).toEqual([1, 2, 3, 4]);
});

it('gives a diverged adapter the floor, and says so when the node has no vLLM', async () => {
  const evaluator = new VllmEvaluator({ command: async () => [process.execPath, STAND_IN, 'serve'], log });
  const [a] = await evaluator.answer({
    modelPath: path.join(dir, 'base'),
    adapterPath: await adapterDir(4, 1e30),
    questions: questions.slice(0, 1),
    maxTokens: 8,
    seed: 7,
  });
  expect(a).toMatchObject({ baseLogLikelihood: -2, adapterLogLikelihood: -100 });

  const none = new VllmEvaluator({ command: async () => null, log });
  await expect(none.answer({ modelPath: dir, adapterPath: dir, questions, maxTokens: 8, seed: 7 })).rejects.toThrow(
    /this node has none to evaluate its PEFT adapter with \(no vllm on PATH, no HANGAR_AGENT_VLLM_COMMAND\)/,
  );
});
