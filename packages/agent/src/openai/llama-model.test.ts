import fs from 'node:fs/promises';
import path from 'node:path';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import type { LlamaModel } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LlamaRuntime, type LoadedModel } from '../llama-runtime.js';
import { EngineError, type GenerateInput } from './engine.js';
import { LlamaServedModel, makesEmbeddings } from './llama-model.js';

// Real llama.cpp (node-llama-cpp's CPU prebuilt) on the tiny random-weight llama: its text is noise, but its
// tokens, template, sampling, sequences and adapters are llama.cpp's own. One runtime, one model loaded with two
// sequences per context, and a few tokens per request: CI has two cores. No assertion is about speed.

const FIXTURE = new URL('../../../common/test/fixtures/peft-h200/', import.meta.url).pathname;
const PROMPT = 'The quick brown fox jumps over the lazy dog again';

let runtime: LlamaRuntime;
let tiny: Awaited<ReturnType<typeof writeTinyLlama>>;
let loaded: LoadedModel;
let dir: string;

beforeAll(async () => {
  tiny = await writeTinyLlama();
  dir = path.dirname(tiny.file);
  runtime = await LlamaRuntime.create({ threads: 1 });
  loaded = await runtime.load(tiny.file, { contextSize: 256, parallel: 2 });
});
afterAll(async () => {
  await loaded?.dispose();
  await runtime?.dispose(500);
  await fs.rm(dir, { recursive: true, force: true });
});

const never = () => new AbortController().signal;
const served = (o: { parallel?: number; queueLimit?: number; embeddings?: boolean } = {}) =>
  new LlamaServedModel('tiny', loaded, { parallel: o.parallel ?? 2, queueLimit: o.queueLimit ?? 4, ...o });
type Completion = Extract<GenerateInput, { kind: 'completion' }>;
const complete = (o: Partial<Omit<Completion, 'kind'>> = {}): Completion => ({
  kind: 'completion',
  prompt: PROMPT,
  maxTokens: 6,
  temperature: 0,
  signal: never(),
  ...o,
});

/** The H200 PEFT fixture made into llama.cpp's adapter GGUF, as an upload or a training job publishes it. */
async function h200Adapter(): Promise<string> {
  const gguf = peftToGguf({
    config: JSON.parse(await fs.readFile(path.join(FIXTURE, 'adapter_config.json'), 'utf8')),
    safetensors: await fs.readFile(path.join(FIXTURE, 'adapter_model.safetensors')),
    base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
  });
  const file = path.join(dir, 'h200.gguf');
  await fs.writeFile(file, gguf);
  return file;
}

describe('LlamaServedModel: text', () => {
  it("answers a chat through the model's own template, counting the prompt in the model's tokens", async () => {
    const model = served();
    const messages = [
      { role: 'system' as const, content: 'Be brief.' },
      { role: 'user' as const, content: 'Hi there' },
    ];
    const out = await model.generate({ kind: 'chat', messages, maxTokens: 5, temperature: 0, signal: never() });
    expect(out.text.length).toBeGreaterThan(0);
    expect(out).toMatchObject({ finishReason: 'length', completionTokens: 5 });
    // The template node-llama-cpp resolves from the GGUF (Llama 2's, for this llama without a chat_template),
    // rendered and tokenized here on its own: the system and user turns, and the model's turn opened.
    const { resolveChatWrapper } = await import('node-llama-cpp');
    const wrapper = resolveChatWrapper(loaded.model);
    const rendered = wrapper.generateContextState({
      chatHistory: [
        { type: 'system', text: 'Be brief.' },
        { type: 'user', text: 'Hi there' },
        { type: 'model', response: [] },
      ],
    }).contextText;
    expect(rendered.toString()).toContain('Hi there');
    expect(out.promptTokens).toBe(rendered.tokenize(loaded.model.tokenizer).length);
    expect(out.promptTokens).toBeGreaterThan(loaded.model.tokenize('Be brief. Hi there').length + 5);
  });

  it('completes a prompt, counting BOS and its tokens, and stops at maxTokens with "length"', async () => {
    const out = await served().generate(complete({ maxTokens: 7 }));
    expect(out.promptTokens).toBe(1 + loaded.model.tokenize(PROMPT).length);
    expect(out).toMatchObject({ finishReason: 'length', completionTokens: 7 });
    // Greedy: the same text again.
    expect((await served().generate(complete({ maxTokens: 7 }))).text).toBe(out.text);
  });

  it('streams pieces that join to the answer, for chats and completions', async () => {
    for (const input of [
      complete({ maxTokens: 10 }),
      { ...complete({ maxTokens: 10 }), kind: 'chat' as const, messages: [{ role: 'user' as const, content: 'Hi' }] },
    ]) {
      const pieces: string[] = [];
      const out = await served().generate({ ...input, onText: (t) => pieces.push(t) });
      expect(pieces.length).toBeGreaterThan(1);
      expect(pieces.join('')).toBe(out.text);
    }
  });

  it('reproduces the same tokens from the same seed at temperature > 0, and others from another seed', async () => {
    const model = served();
    const sampled = (seed: number) => model.generate(complete({ maxTokens: 10, temperature: 0.9, topP: 0.95, seed }));
    const a = await sampled(42);
    const b = await sampled(42);
    const c = await sampled(43);
    expect(b.text).toBe(a.text);
    expect(c.text).not.toBe(a.text);
  });

  it('ends before a stop string and leaves it out of the answer, for completions and chats', async () => {
    const model = served();
    for (const input of [
      complete({ maxTokens: 12 }),
      { ...complete({ maxTokens: 12 }), kind: 'chat' as const, messages: [{ role: 'user' as const, content: 'Hi' }] },
    ]) {
      const full = await model.generate(input);
      // Two characters from the middle of what the model says greedily: it says the same up to there again.
      const at = Math.floor(full.text.length / 2);
      const stop = full.text.slice(at, at + 2);
      const out = await model.generate({ ...input, stop: ['never said, surely', stop] });
      expect(out.text).toBe(full.text.slice(0, full.text.indexOf(stop)));
      expect(out.finishReason).toBe('stop');
    }
  });

  it("refuses a prompt longer than a sequence's context, and a chat that does not end with the user", async () => {
    const model = served();
    const long = 'word '.repeat(300);
    // OpenAI's context_length_exceeded over HTTP (reply.ts): what `hangar chat` reads to drop old turns.
    await expect(model.generate(complete({ prompt: long }))).rejects.toMatchObject({
      kind: 'too_long',
      param: 'prompt',
      message: expect.stringMatching(/the prompt is \d+ tokens and tiny holds 256 per request/),
    });
    await expect(
      model.generate({ kind: 'chat', messages: [{ role: 'assistant', content: 'Hi' }], signal: never() }),
    ).rejects.toMatchObject({ kind: 'bad_request', param: 'messages' });
  });
});

describe('LlamaServedModel: sequences and the queue', () => {
  it('generates two requests at once with parallel 2; a third waits and is answered', async () => {
    const model = served({ parallel: 2, queueLimit: 4 });
    const events: string[] = [];
    const request = (name: string, maxTokens: number) =>
      model
        .generate(
          complete({
            maxTokens,
            onText: () => {
              if (!events.includes(`${name} text`)) events.push(`${name} text`);
            },
          }),
        )
        .then((out) => {
          events.push(`${name} done`);
          return out;
        });
    const a = request('a', 24);
    const b = request('b', 24);
    const c = request('c', 4);
    // Sequences are taken in arrival order, before anything is evaluated.
    expect(model.active).toBe(2);
    expect(model.queued).toBe(1);
    const [ra, rb, rc] = await Promise.all([a, b, c]);
    expect([ra.completionTokens, rb.completionTokens, rc.completionTokens]).toEqual([24, 24, 4]);
    // Both generated side by side (one batch); the third began only once one of them was done.
    expect(events.indexOf('b text')).toBeLessThan(events.indexOf('a done'));
    expect(events.indexOf('c text')).toBeGreaterThan(Math.min(events.indexOf('a done'), events.indexOf('b done')));
    expect(model.active).toBe(0);
  });

  it('refuses a request as busy when every sequence is generating and the queue is full', async () => {
    const model = served({ parallel: 1, queueLimit: 1 });
    const a = model.generate(complete({ maxTokens: 8 }));
    const b = model.generate(complete({ maxTokens: 2 }));
    const c = model.generate(complete({ maxTokens: 2 }));
    await expect(c).rejects.toBeInstanceOf(EngineError);
    await expect(c).rejects.toMatchObject({ kind: 'busy', message: expect.stringMatching(/tiny is busy/) });
    expect(model.queued).toBe(1);
    await Promise.all([a, b]);
    expect(model.queued).toBe(0);
  });

  it('stops generating the moment its signal aborts and frees the sequence for the next request', async () => {
    const model = served({ parallel: 1, queueLimit: 0 });
    const gone = new AbortController();
    let afterAbort = 0;
    const a = model.generate(
      complete({
        maxTokens: 200,
        signal: gone.signal,
        onText: () => {
          if (gone.signal.aborted) afterAbort++;
          else gone.abort(new Error('the client went away'));
        },
      }),
    );
    await expect(a).rejects.toThrow('the client went away');
    expect(afterAbort).toBe(0);
    expect(model.active).toBe(0);
    // With no queue at all, the next request is refused unless the sequence is already free.
    const b = model.generate(complete({ maxTokens: 3 }));
    expect(model.active).toBe(1);
    const out = await b;
    expect(out.completionTokens).toBe(3);
    // What the aborted request left in the sequence is gone: greedy from an empty sequence again.
    expect(out.text).toBe((await served().generate(complete({ maxTokens: 3 }))).text);
  });

  it('drains before unloading: what waits is refused, what generates finishes, nothing new is taken', async () => {
    const model = served({ parallel: 1, queueLimit: 2 });
    const a = model.generate(complete({ maxTokens: 8 }));
    const b = model.generate(complete({ maxTokens: 2 }));
    const drained = model.drain();
    await expect(b).rejects.toMatchObject({ kind: 'busy', message: 'tiny is stopping on this node: try again' });
    await expect(model.generate(complete())).rejects.toMatchObject({ kind: 'busy' });
    expect((await a).completionTokens).toBe(8);
    await drained;
    expect(model.active).toBe(0);
  });

  it('drops a waiting request whose signal aborts, without taking a sequence', async () => {
    const model = served({ parallel: 1, queueLimit: 2 });
    const a = model.generate(complete({ maxTokens: 8 }));
    const gone = new AbortController();
    const b = model.generate(complete({ signal: gone.signal }));
    expect(model.queued).toBe(1);
    gone.abort(new Error('the client went away'));
    await expect(b).rejects.toThrow('the client went away');
    expect(model.queued).toBe(0);
    await a;
  });
});

describe('LlamaServedModel: adapters', () => {
  it('loads an adapter while serving, answers with it applied, and refuses an adapter it does not have', async () => {
    const model = served();
    expect(model.adapters()).toEqual([]);
    const file = await h200Adapter();
    // Published after the replica started: it loads while a base request is generating.
    const running = model.generate(complete({ maxTokens: 16 }));
    const smoke = await model.addAdapter('h200-tuned', file);
    expect(smoke.tokens).toBeGreaterThanOrEqual(1);
    expect((await running).completionTokens).toBe(16);
    expect(model.adapters()).toEqual(['h200-tuned']);
    const base = await model.generate(complete({ maxTokens: 10 }));
    const tuned = await model.generate(complete({ maxTokens: 10, adapter: 'h200-tuned' }));
    expect(tuned.promptTokens).toBe(base.promptTokens);
    expect(tuned.text).not.toBe(base.text);
    // Greedy with the adapter is as reproducible as without, and its context has `parallel` sequences too.
    const twice = [
      model.generate(complete({ maxTokens: 10, adapter: 'h200-tuned' })),
      model.generate(complete({ maxTokens: 10, adapter: 'h200-tuned' })),
    ];
    expect([model.active, model.queued]).toEqual([2, 0]);
    expect((await Promise.all(twice)).map((o) => o.text)).toEqual([tuned.text, tuned.text]);
    // The smoke test goes the same way as a request, the adapter's too.
    const throughRequests = await model.smoke({ adapter: 'h200-tuned', prompt: PROMPT, maxTokens: 10 });
    expect(throughRequests).toMatchObject({ text: tuned.text, tokens: 10 });
    expect(throughRequests.firstTokenMs).toBeLessThanOrEqual(throughRequests.ms);
    await expect(model.generate(complete({ adapter: 'nobody' }))).rejects.toMatchObject({
      kind: 'unknown_adapter',
      param: 'model',
      message: 'tiny has no adapter "nobody" loaded here; it has "h200-tuned"',
    });
    // Unloaded: refused from then on, and the base serves on.
    await model.removeAdapter('h200-tuned');
    expect(model.adapters()).toEqual([]);
    await expect(model.generate(complete({ adapter: 'h200-tuned' }))).rejects.toMatchObject({
      kind: 'unknown_adapter',
    });
    expect((await model.generate(complete({ maxTokens: 10 }))).text).toBe(base.text);
  });

  it('refuses a broken adapter file by name while the base keeps serving', async () => {
    const model = served();
    const broken = path.join(dir, 'broken.gguf');
    await fs.writeFile(broken, 'this is not an adapter');
    await expect(model.addAdapter('broken-one', broken)).rejects.toThrow(
      /^adapter "broken-one" did not load on tiny: .*invalid magic.*; the base model keeps serving$/,
    );
    expect(model.adapters()).toEqual([]);
    await expect(model.generate(complete({ adapter: 'broken-one' }))).rejects.toMatchObject({
      kind: 'unknown_adapter',
    });
    expect((await model.generate(complete({ maxTokens: 3 }))).completionTokens).toBe(3);
    // A base model's own GGUF is no adapter either; llama.cpp says so, and nothing is left loaded.
    await expect(model.addAdapter('not-lora', tiny.file)).rejects.toThrow(/^adapter "not-lora" did not load on tiny/);
    expect(model.adapters()).toEqual([]);
  });
});

describe('LlamaServedModel: embeddings and memory', () => {
  it('says the tiny chat llama makes no embeddings, and embeds with a context of its own when told it does', async () => {
    const chat = served();
    expect(chat.embeddings).toBe(false);
    await expect(chat.embed(['hello'], never())).rejects.toMatchObject({ kind: 'unsupported', param: 'model' });
    const embedder = served({ embeddings: true });
    const out = await embedder.embed(['hello', 'hello world'], never());
    expect(out.vectors.map((v) => v.length)).toEqual([64, 64]);
    expect(out.vectors[0]).not.toEqual(out.vectors[1]);
    expect(out.promptTokens).toBe(
      1 + loaded.model.tokenize('hello').length + 1 + loaded.model.tokenize('hello world').length,
    );
    // The same input, the same vector.
    expect((await embedder.embed(['hello'], never())).vectors[0]).toEqual(out.vectors[0]);
  });

  it('decides from the GGUF which models embed: encoders and those with a pooling type, not rerankers', () => {
    const model = (architecture: string, pooling?: number, encoderOnly = false) =>
      ({
        fileInfo: { metadata: { general: { architecture }, [architecture]: { pooling_type: pooling } } },
        fileInsights: { hasEncoder: encoderOnly, hasDecoder: !encoderOnly },
      }) as unknown as LlamaModel;
    expect(makesEmbeddings(loaded.model)).toBe(false);
    expect(makesEmbeddings(model('bert'))).toBe(true);
    expect(makesEmbeddings(model('nomic-bert', 1))).toBe(true);
    expect(makesEmbeddings(model('qwen3', 3))).toBe(true); // Qwen3-Embedding: a decoder with last-token pooling
    expect(makesEmbeddings(model('qwen3', 4))).toBe(false); // a reranker
    expect(makesEmbeddings(model('qwen3', 0))).toBe(false);
    expect(makesEmbeddings(model('llama'))).toBe(false);
    expect(makesEmbeddings(model('some-encoder', undefined, true))).toBe(true);
  });

  it('reports what the replica holds on the GPU: nothing, on this CPU-only runtime', () => {
    expect(runtime.gpu).toBe(false);
    expect(loaded.parallel).toBe(2);
    expect(loaded.context.totalSequences).toBe(2);
    expect(loaded.memory).toEqual({
      gpu: false,
      gpuLayers: 0,
      totalLayers: loaded.model.fileInsights.totalLayers,
      vramUsedBytes: 0,
    });
  });

  it('refuses a parallel larger than the sequences the model was loaded with', () => {
    expect(() => served({ parallel: 3 })).toThrow(/parallel is 1 to the 2 sequences the model was loaded with, not 3/);
  });
});
