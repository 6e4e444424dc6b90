import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// The trainer (packages/agent/trainer/train_lora.py) runs on GPU nodes with torch, transformers and peft; CI has none
// of them. What CI can check: the file parses, --dry-run validates a job without importing torch, errors are
// protocol lines, and the data path puts the loss on the answer tokens alone (with a stand-in tokenizer).
// The training itself is checked on a GPU by packages/agent/trainer/device-check.sh.

const script = fileURLToPath(new URL('../trainer/train_lora.py', import.meta.url));
// Skipped, not failed, where there is no python3 at all: the trainer is a node's concern, and a control-plane
// developer's machine may have none. CI's image has python3, so there the checks run.
const python = spawnSync('python3', ['--version']).status === 0 ? 'python3' : null;

let dir: string;
/** A PYTHONPATH whose torch, transformers and peft fail on import: a dry run must not touch them. */
let poisoned: string;

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-trainer-'));
  poisoned = path.join(dir, 'poisoned');
  for (const name of ['torch', 'transformers', 'peft']) {
    await fs.mkdir(path.join(poisoned, name), { recursive: true });
    await fs.writeFile(
      path.join(poisoned, name, '__init__.py'),
      `raise ImportError("${name} was imported", name="${name}")\n`,
    );
  }
});
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

const PARAMS = { rank: 8, alpha: 16, dropout: 0.05, epochs: 3, lr: 0.0002, batch: 4, max_len: 128, seed: 7 };

/** A job directory: base (config.json, weights, tokenizer), data and job.json; `edit` changes it first. */
async function jobDir(name: string, edit: (job: Record<string, unknown>) => void | Promise<void> = () => {}) {
  const root = path.join(dir, name);
  const base = path.join(root, 'base');
  await fs.mkdir(base, { recursive: true });
  await fs.writeFile(
    path.join(base, 'config.json'),
    JSON.stringify({ model_type: 'llama', architectures: ['LlamaForCausalLM'], max_position_embeddings: 512 }),
  );
  await fs.writeFile(path.join(base, 'model.safetensors'), Buffer.alloc(64));
  await fs.writeFile(path.join(base, 'tokenizer.json'), '{}');
  const lines = Array.from({ length: 10 }, (_, i) => JSON.stringify({ q: `question ${i}?`, a: `answer ${i}` }));
  await fs.writeFile(path.join(root, 'data.ndjson'), `${lines.join('\n')}\n`);
  const job: Record<string, unknown> = {
    id: 'j1',
    name: 'support-bot',
    params: { ...PARAMS },
    data_path: path.join(root, 'data.ndjson'),
    base_dir: base,
    out_dir: path.join(root, 'out'),
  };
  await edit(job);
  await fs.writeFile(path.join(root, 'job.json'), JSON.stringify(job));
  return { root, job: path.join(root, 'job.json'), out: path.join(root, 'out') };
}

function run(args: string[]) {
  const r = spawnSync(python!, [script, ...args], {
    encoding: 'utf8',
    env: { ...process.env, PYTHONPATH: poisoned },
    timeout: 20_000,
  });
  const lines = r.stdout.split('\n').filter(Boolean);
  // Every stdout line is a protocol line: JSON with an event.
  const events = lines.map((l) => JSON.parse(l) as { event: string; [k: string]: unknown });
  for (const e of events) expect(typeof e.event).toBe('string');
  return { status: r.status, events, stderr: r.stderr };
}

describe.skipIf(!python)('train_lora.py', () => {
  it('compiles', () => {
    const r = spawnSync(python!, ['-m', 'py_compile', script], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('--dry-run checks the job and prints the plan without importing torch', async () => {
    const j = await jobDir('good');
    const r = run(['--job', j.job, '--out', j.out, '--dry-run']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.events).toHaveLength(1);
    expect(r.events[0]).toMatchObject({
      event: 'plan',
      model_type: 'llama',
      weights: ['model.safetensors'],
      tokenizer: ['tokenizer.json'],
      pairs: 10,
      steps: 9, // 3 epochs of ceil(10 / 4) batches
      params: PARAMS,
      target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
      out_dir: j.out,
    });
    // The dry run leaves the output directory to the real run.
    await expect(fs.stat(j.out)).rejects.toThrow();
  });

  const refusals: [string, (job: Record<string, unknown>) => void | Promise<void>, RegExp][] = [
    [
      'a rank of 0',
      (job) => {
        (job.params as Record<string, unknown>).rank = 0;
      },
      /params\.rank is 0: a whole number from 1 to 1024/,
    ],
    ['a missing seed', (job) => void delete (job.params as Record<string, unknown>).seed, /params has no "seed"/],
    [
      'a base without config.json',
      async (job) => fs.rm(path.join(job.base_dir as string, 'config.json')),
      /has no config\.json/,
    ],
    [
      'a base with pickled weights only',
      async (job) => {
        const base = job.base_dir as string;
        await fs.rename(path.join(base, 'model.safetensors'), path.join(base, 'pytorch_model.bin'));
      },
      /has only pickled weights \(pytorch_model\.bin\)/,
    ],
    [
      'a data line that is not a pair',
      async (job) => fs.appendFile(job.data_path as string, '{"q":"only a question"}\n'),
      /data\.ndjson line 11: "a" is not a non-empty string/,
    ],
  ];
  for (const [what, edit, message] of refusals) {
    it(`--dry-run refuses ${what} with one error event`, async () => {
      const j = await jobDir(what.replaceAll(' ', '-'), edit);
      const r = run(['--job', j.job, '--out', j.out, '--dry-run']);
      expect(r.status).toBe(1);
      expect(r.events).toEqual([{ event: 'error', message: expect.stringMatching(message) }]);
    });
  }

  it('without torch, a real run ends in one error event saying what to install', async () => {
    const j = await jobDir('no-torch');
    const r = run(['--job', j.job, '--out', j.out]);
    expect(r.status).toBe(1);
    expect(r.events).toEqual([
      { event: 'error', message: expect.stringMatching(/torch is not installed in .*requirements\.txt/) },
    ]);
  });

  it('stops on SIGTERM while loading: exit 143, one error event, within seconds', async () => {
    // A torch whose import takes 30 s stands in for loading a large base; the agent's cancel must not wait it out.
    const slow = path.join(dir, 'slow');
    await fs.mkdir(path.join(slow, 'torch'), { recursive: true });
    await fs.writeFile(
      path.join(slow, 'torch', '__init__.py'),
      'import sys, time\nprint("importing torch", file=sys.stderr, flush=True)\ntime.sleep(30)\n',
    );
    const j = await jobDir('sigterm');
    const child = spawn(python!, [script, '--job', j.job, '--out', j.out], {
      env: { ...process.env, PYTHONPATH: slow },
    });
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
    });
    await new Promise<void>((resolve) => {
      child.stderr.on('data', (d: Buffer) => {
        if (d.toString().includes('importing torch')) resolve();
      });
    });
    const sent = Date.now();
    child.kill('SIGTERM');
    const [code] = await once(child, 'exit');
    expect(code).toBe(143);
    expect(Date.now() - sent).toBeLessThan(5_000);
    expect(
      stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l)),
    ).toEqual([{ event: 'error', message: 'stopped by SIGTERM before training started' }]);
  });

  it('puts the loss on the answer tokens alone, in both prompt formats', () => {
    // A stand-in tokenizer (one token per character) exercises encode_pairs, the code that builds the labels,
    // without transformers.
    const program = `
import json, sys
sys.path.insert(0, ${JSON.stringify(path.dirname(script))})
from train_lora import encode_pairs

class Chars:
    eos_token_id = 1
    def __init__(self, template):
        self.chat_template = template
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([2] if add_special_tokens else []) + [ord(c) for c in text]}
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

pairs = [{"q": "why?", "a": "because"}, {"q": "x" * 50, "a": "y"}]
out = {}
for name, tok in (("chat", Chars("{{ messages }}")), ("plain", Chars(None))):
    examples, dropped, fmt = encode_pairs(tok, pairs, 40)
    out[name] = {"fmt": fmt, "dropped": dropped, "examples": examples}
print(json.dumps(out))
`;
    const r = spawnSync(python!, ['-c', program], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: poisoned } });
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as Record<
      string,
      { fmt: string; dropped: number; examples: [number[], number[]][] }
    >;
    const text = (ids: number[]) => String.fromCharCode(...ids.filter((i) => i > 2));

    const chat = out.chat!;
    expect(chat.fmt).toBe('chat template');
    // The 50-character question fills max_len 40 on its own: dropped, since it has no answer to learn.
    expect(chat.dropped).toBe(1);
    const [ids, labels] = chat.examples[0]!;
    expect(text(ids)).toBe('<user>why?</><assistant>because</>');
    expect(text(labels.filter((l) => l !== -100))).toBe('because</>');
    expect(labels.slice(0, '<user>why?</><assistant>'.length).every((l) => l === -100)).toBe(true);

    const plain = out.plain!;
    expect(plain.fmt).toBe('Question/Answer');
    const [pids, plabels] = plain.examples[0]!;
    expect(pids[0]).toBe(2); // BOS from the tokenizer
    expect(text(pids)).toBe('Question: why?\nAnswer: because');
    expect(pids.at(-1)).toBe(1); // closed with EOS, so the model learns to stop
    expect(text(plabels.filter((l) => l !== -100))).toBe(' because');
    expect(plabels.at(-1)).toBe(1);
  });
});
