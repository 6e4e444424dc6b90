import fs from 'node:fs/promises';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { openAiClient, readChatStream } from '@hangar/common/test/fixtures/openai-client';
import { writeTinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newEngineKey } from '../control-plane.js';
import { LlamaRuntime, type LoadedModel } from '../llama-runtime.js';
import { createOpenAiServer, type OpenAiServer } from './http.js';
import { LlamaServedModel } from './llama-model.js';

// A node's endpoint as applications (through the gateway) meet it: the agent's HTTP layer in front of real
// llama.cpp on the tiny random-weight llama, over a real socket, called with the official `openai` client.
// The text is noise; the protocol, the tokens, the sampling, the sequences and the adapter are real.

const FIXTURE = new URL('../../../common/test/fixtures/peft-h200/', import.meta.url).pathname;
const PROMPT = 'The quick brown fox jumps over the lazy dog again';

let runtime: LlamaRuntime;
let loaded: LoadedModel;
let served: LlamaServedModel;
let http: OpenAiServer;
let url: string;
let dir: string;
const key = newEngineKey();

beforeAll(async () => {
  const tiny = await writeTinyLlama();
  dir = path.dirname(tiny.file);
  runtime = await LlamaRuntime.create({ threads: 1 });
  loaded = await runtime.load(tiny.file, { contextSize: 512, parallel: 2 });
  served = new LlamaServedModel('tiny', loaded, { parallel: 2, queueLimit: 1 });
  const adapter = path.join(dir, 'h200.gguf');
  await fs.writeFile(
    adapter,
    peftToGguf({
      config: JSON.parse(await fs.readFile(path.join(FIXTURE, 'adapter_config.json'), 'utf8')),
      safetensors: await fs.readFile(path.join(FIXTURE, 'adapter_model.safetensors')),
      base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
    }),
  );
  await served.addAdapter('tiny-h200', adapter);
  http = createOpenAiServer({ log: createLogger('silent') });
  http.serve(served, key);
  url = await http.listen({ host: '127.0.0.1', port: 0 });
});
afterAll(async () => {
  await http?.close();
  await served?.drain();
  await loaded?.dispose();
  await runtime?.dispose(500);
  await fs.rm(dir, { recursive: true, force: true });
});

const client = () => openAiClient(url, key);
const until = async (check: () => boolean, what: string) => {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`still waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe("the agent's endpoint, on real llama.cpp", () => {
  it('answers a chat completion, and streams the same answer with its usage', async () => {
    const messages = [
      { role: 'system' as const, content: 'Be brief.' },
      { role: 'user' as const, content: 'Say hello.' },
    ];
    const answer = await client().chat.completions.create({ model: 'tiny', messages, max_tokens: 8, temperature: 0 });
    expect(answer.object).toBe('chat.completion');
    expect(answer.model).toBe('tiny');
    expect(answer.choices[0]?.message.role).toBe('assistant');
    expect(answer.usage?.completion_tokens).toBeGreaterThan(0);
    expect(answer.usage?.total_tokens).toBe(
      (answer.usage?.prompt_tokens ?? 0) + (answer.usage?.completion_tokens ?? 0),
    );

    const stream = await client().chat.completions.create({
      model: 'tiny',
      messages,
      max_tokens: 8,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    const read = await readChatStream(stream);
    // Greedy: the streamed pieces are the same answer, counted the same way.
    expect(read.text).toBe(answer.choices[0]?.message.content);
    expect(read.finishReason).toBe(answer.choices[0]?.finish_reason);
    expect(read.usage).toMatchObject({
      prompt_tokens: answer.usage?.prompt_tokens,
      completion_tokens: answer.usage?.completion_tokens,
    });
  });

  it("reuses a conversation's earlier turns: turn 2 reports the prompt tokens it did not compute as cached_tokens", async () => {
    const system = {
      role: 'system' as const,
      content: `You answer questions about ${'foxes and dogs, '.repeat(12)}briefly.`,
    };
    const first = [system, { role: 'user' as const, content: 'What does the fox do?' }];
    const turn1 = await client().chat.completions.create({
      model: 'tiny',
      messages: first,
      max_tokens: 4,
      temperature: 0,
    });
    const reply = turn1.choices[0]?.message.content ?? '';
    const second = [
      ...first,
      { role: 'assistant' as const, content: reply },
      { role: 'user' as const, content: 'And the dog?' },
    ];
    const turn2 = await client().chat.completions.create({
      model: 'tiny',
      messages: second,
      max_tokens: 4,
      temperature: 0,
    });
    const cached = turn2.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    // At least the system prompt and the first question came from the sequence turn 1 left; the new turn did not.
    expect(cached).toBeGreaterThanOrEqual(loaded.model.tokenize(system.content).length);
    expect(cached).toBeLessThan(turn2.usage?.prompt_tokens ?? 0);
    // Counted as OpenAI counts it: cached tokens are part of prompt_tokens, not added to them.
    expect(turn2.usage?.total_tokens).toBe((turn2.usage?.prompt_tokens ?? 0) + (turn2.usage?.completion_tokens ?? 0));
  });

  it("completes a prompt, counting usage in the model's own tokens", async () => {
    const done = await client().completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 5, temperature: 0 });
    expect(done.object).toBe('text_completion');
    expect(done.choices[0]?.finish_reason).toBe('length');
    // The prompt as llama.cpp tokenizes it, with the beginning-of-sequence token the completion puts first.
    expect(done.usage?.prompt_tokens).toBe(loaded.model.tokenize(PROMPT).length + 1);
    expect(done.usage?.completion_tokens).toBe(5);
  });

  it('gives the same tokens for the same seed, and others for another', async () => {
    const ask = (seed: number) =>
      client().completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 12, temperature: 0.9, seed });
    const [a, b, c] = [await ask(7), await ask(7), await ask(8)];
    expect(b.choices[0]?.text).toBe(a.choices[0]?.text);
    expect(c.choices[0]?.text).not.toBe(a.choices[0]?.text);
  });

  it('answers with the adapter applied when a request names it, and lists it beside its model', async () => {
    const ask = (model: string) =>
      client().completions.create({ model, prompt: PROMPT, max_tokens: 10, temperature: 0 });
    const base = await ask('tiny');
    const tuned = await ask('tiny-h200');
    expect(tuned.model).toBe('tiny-h200');
    expect(tuned.choices[0]?.text).not.toBe(base.choices[0]?.text);
    const models = await client().models.list();
    expect(models.data.map((m) => m.id).sort()).toEqual(['tiny', 'tiny-h200']);
  });

  it("refuses a key that is not the replica's", async () => {
    const wrong = openAiClient(url, newEngineKey());
    await expect(
      wrong.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
    ).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
  });

  it('queues requests beyond its sequences, answers them, and refuses past the queue', async () => {
    const ask = () => client().completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 120, temperature: 0 });
    const first = [ask(), ask()];
    await until(() => served.active === 2, 'two requests generating');
    const third = ask();
    await until(() => served.queued === 1, 'a third request waiting');
    await expect(ask()).rejects.toBeInstanceOf(OpenAI.RateLimitError);
    const answered = await Promise.all([...first, third]);
    expect(answered.map((a) => a.choices[0]?.finish_reason)).toEqual(['length', 'length', 'length']);
  });

  it('frees the sequences of clients that go away mid-stream', async () => {
    const leaving = [new AbortController(), new AbortController()];
    const streams = await Promise.all(
      leaving.map((c) =>
        client().chat.completions.create(
          { model: 'tiny', messages: [{ role: 'user', content: 'Go on.' }], max_tokens: 400, stream: true },
          { signal: c.signal },
        ),
      ),
    );
    // Each has started answering; then both clients hang up.
    for (const s of streams) await s[Symbol.asyncIterator]().next();
    expect(served.active).toBe(2);
    for (const c of leaving) c.abort();
    await until(() => served.active === 0, 'both sequences freed');
    const next = await client().completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 3 });
    expect(next.usage?.completion_tokens).toBe(3);
  });
});
