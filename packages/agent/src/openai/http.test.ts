import net from 'node:net';
import { createLogger } from '@hangar/common/log';
import { openAiClient, postForEvents, readChatStream } from '@hangar/common/test/fixtures/openai-client';
import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { type Embedded, EngineError, type Generated, type GenerateInput, type ServedModel } from './engine.js';
import { createOpenAiServer, type OpenAiServer } from './http.js';

// The HTTP layer on its own, over a real socket, with the official `openai` client. The model behind it is a
// test double written here (what generates tokens is llama-model.ts, tested with real llama.cpp on its own and
// end to end): it answers deterministic words, counts a token per word, and honours `signal` and `onText`.

/** Answers "w0 w1 …" (seeded answers say "s<seed>-0 …"), five words unless max_tokens says fewer. */
class FakeModel implements ServedModel {
  readonly embeddings: boolean;
  adapterNames: string[] = [];
  calls: GenerateInput[] = [];
  /** Refuse everything as a full queue would. */
  busy = false;
  /** Never finish: a piece every few ms until the signal is aborted (a client that goes away mid-answer). */
  endless = false;
  /** Say nothing until the signal is aborted (a client that goes away before the first token). */
  silent = false;
  /** Fail (an unexpected error, such as llama.cpp running out of memory) after this many pieces of text. */
  failAfter?: number;
  /** Signals of the requests that were aborted, as the model saw them. */
  aborted: GenerateInput[] = [];

  private disposers: (() => void)[] = [];

  /** What stopping a replica does to the requests it is answering: they fail. */
  dispose() {
    for (const d of this.disposers.splice(0)) d();
  }

  constructor(
    readonly name: string,
    options: { embeddings?: boolean } = {},
  ) {
    this.embeddings = options.embeddings ?? false;
  }

  adapters() {
    return this.adapterNames;
  }

  async generate(input: GenerateInput): Promise<Generated> {
    this.calls.push(input);
    input.signal.addEventListener('abort', () => this.aborted.push(input), { once: true });
    if (this.busy) throw new EngineError('busy', `every sequence of ${this.name} is taken and its queue is full`);
    if (input.adapter === 'broken-adapter') {
      throw new EngineError('unknown_adapter', "the adapter 'broken-adapter' failed to load", 'model');
    }
    const promptText = input.kind === 'chat' ? input.messages.map((m) => m.content).join(' ') : input.prompt;
    const promptTokens = promptText.split(/\s+/).filter(Boolean).length;
    if (this.endless || this.silent) {
      let i = 0;
      await new Promise<void>((_, reject) => {
        const timer = setInterval(() => {
          if (this.endless) input.onText?.(`${i++ ? ' ' : ''}w${i}`);
        }, 5);
        input.signal.addEventListener('abort', () => {
          clearInterval(timer);
          reject(input.signal.reason);
        });
        this.disposers.push(() => {
          clearInterval(timer);
          reject(new Error('the model was disposed'));
        });
      });
    }
    if (this.failAfter !== undefined) {
      for (let i = 0; i < this.failAfter; i++) input.onText?.(`w${i} `);
      throw new Error('llama_decode failed: out of memory');
    }
    const words = Array.from({ length: 5 }, (_, i) => (input.seed === undefined ? `w${i}` : `s${input.seed}-${i}`));
    const max = input.maxTokens ?? Number.POSITIVE_INFINITY;
    let text = '';
    let completionTokens = 0;
    let finishReason: Generated['finishReason'] = 'stop';
    for (const word of words) {
      const piece = completionTokens ? ` ${word}` : word;
      const next = text + piece;
      const stopAt = (input.stop ?? []).map((s) => next.indexOf(s)).filter((i) => i >= 0);
      if (stopAt.length) {
        const cut = next.slice(0, Math.min(...stopAt));
        if (cut.length > text.length) input.onText?.(cut.slice(text.length));
        text = cut;
        break;
      }
      if (completionTokens >= max) {
        finishReason = 'length';
        break;
      }
      input.onText?.(piece);
      text = next;
      completionTokens++;
    }
    return { text, finishReason, promptTokens, completionTokens };
  }

  async embed(input: string[], _signal: AbortSignal): Promise<Embedded> {
    if (!this.embeddings) throw new EngineError('unsupported', `${this.name} does not make embeddings`);
    return {
      vectors: input.map((s) => [s.length, 0.5, -0.25]),
      promptTokens: input.reduce((n, s) => n + s.split(/\s+/).filter(Boolean).length, 0),
    };
  }
}

const KEY = 'engine-key-of-tiny-0123456789';
const EMBED_KEY = 'engine-key-of-embedder-9876543210';
let server: OpenAiServer;
let url: string;
let tiny: FakeModel;
let embedder: FakeModel;
let client: OpenAI;
const logLines: string[] = [];

beforeAll(async () => {
  server = createOpenAiServer({
    log: createLogger('debug', (l) => logLines.push(l)),
    maxBodyBytes: 64 * 1024,
    bodyTimeoutMs: 500,
  });
  url = await server.listen({ host: '127.0.0.1', port: 0 });
  client = openAiClient(url, KEY);
});
afterAll(async () => {
  await server?.close();
});
beforeEach(() => {
  for (const name of ['tiny', 'embedder']) server.unserve(name);
  tiny = new FakeModel('tiny');
  tiny.adapterNames = ['tiny-pirate', 'broken-adapter'];
  embedder = new FakeModel('embedder', { embeddings: true });
  server.serve(tiny, KEY);
  server.serve(embedder, EMBED_KEY);
});

async function until(what: string, check: () => boolean) {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`waited 10 s for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('chat completions', () => {
  it('answers a non-streaming chat with id, object, model, the message and usage', async () => {
    const before = Math.floor(Date.now() / 1000);
    const out = await client.chat.completions.create({
      model: 'tiny',
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: [{ type: 'text', text: 'hello there' }] },
      ],
    });
    expect(out.id).toMatch(/^chatcmpl-[0-9a-f]{24}$/);
    expect(out.object).toBe('chat.completion');
    expect(out.model).toBe('tiny');
    expect(out.created).toBeGreaterThanOrEqual(before);
    expect(out.choices).toEqual([
      {
        index: 0,
        message: { role: 'assistant', content: 'w0 w1 w2 w3 w4', refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ]);
    expect(out.usage).toEqual({ prompt_tokens: 4, completion_tokens: 5, total_tokens: 9 });
    // The roles and the text parts reach the model as plain messages.
    expect(tiny.calls[0]).toMatchObject({
      kind: 'chat',
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'hello there' },
      ],
    });
    expect(tiny.calls[0]?.adapter).toBeUndefined();
  });

  it('passes max_tokens, seed, stop, temperature and top_p through to the model', async () => {
    const out = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 3,
      seed: 42,
      temperature: 0.7,
      top_p: 0.9,
    });
    expect(out.choices[0]?.message.content).toBe('s42-0 s42-1 s42-2');
    expect(out.choices[0]?.finish_reason).toBe('length');
    expect(tiny.calls[0]).toMatchObject({ maxTokens: 3, seed: 42, temperature: 0.7, topP: 0.9 });
    expect(tiny.calls[0]?.stop).toBeUndefined();

    const stopped = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      stop: ' w2',
      max_completion_tokens: 4,
    });
    expect(stopped.choices[0]?.message.content).toBe('w0 w1');
    expect(stopped.choices[0]?.finish_reason).toBe('stop');
    // One string becomes a list; max_completion_tokens is the newer name of max_tokens.
    expect(tiny.calls[1]).toMatchObject({ stop: [' w2'], maxTokens: 4 });

    await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      stop: ['a', 'b', 'c', 'd'],
    });
    expect(tiny.calls[2]?.stop).toEqual(['a', 'b', 'c', 'd']);
  });

  it('streams the answer as OpenAI does: a role chunk, text deltas, the finish reason, [DONE]', async () => {
    const stream = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hello' }],
      stream: true,
    });
    const read = await readChatStream(stream);
    expect(read.text).toBe('w0 w1 w2 w3 w4');
    expect(read.textChunks).toBe(5);
    expect(read.finishReason).toBe('stop');
    expect(read.usage).toBeNull();
    const [first, ...rest] = read.chunks;
    expect(first?.choices[0]?.delta).toEqual({ role: 'assistant', content: '', refusal: null });
    // One id, object and model for every chunk; the finish reason only on the last.
    for (const c of read.chunks)
      expect(c).toMatchObject({ id: first?.id, object: 'chat.completion.chunk', model: 'tiny' });
    expect(rest.slice(0, -1).every((c) => c.choices[0]?.finish_reason === null)).toBe(true);
    expect(rest.at(-1)?.choices[0]).toEqual({ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' });
  });

  it('sends exactly `data: {chunk}` events and `data: [DONE]` on the wire', async () => {
    const out = await postForEvents(url, '/v1/chat/completions', KEY, {
      model: 'tiny',
      messages: [{ role: 'user', content: 'hello' }],
      max_tokens: 2,
      stream: true,
    });
    expect(out.status).toBe(200);
    expect(out.contentType).toMatch(/^text\/event-stream/);
    expect(out.raw.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(
      out.raw
        .split('\n\n')
        .slice(0, -1)
        .every((e) => e.startsWith('data: ')),
    ).toBe(true);
    expect(out.events.at(-1)).toBe('[DONE]');
    const chunks = out.events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks.map((c) => c.choices[0].delta.content ?? null)).toEqual(['', 'w0', ' w1', null]);
    expect(chunks.at(-1).choices[0].finish_reason).toBe('length');
    expect('usage' in chunks[0]).toBe(false);
  });

  it('adds a last chunk with the usage and no choices when stream_options.include_usage is set', async () => {
    const stream = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'one two three' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const read = await readChatStream(stream);
    const last = read.chunks.at(-1);
    expect(last?.choices).toEqual([]);
    expect(last?.usage).toEqual({ prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 });
    // Every other chunk carries usage: null, as OpenAI's reference says.
    expect(read.chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
    expect(read.chunks.at(-2)?.choices[0]?.finish_reason).toBe('stop');
  });

  it('answers for an adapter named as the model, with that adapter', async () => {
    const out = await client.chat.completions.create({
      model: 'tiny-pirate',
      messages: [{ role: 'user', content: 'ahoy' }],
    });
    expect(out.model).toBe('tiny-pirate');
    expect(tiny.calls[0]?.adapter).toBe('tiny-pirate');
    // An adapter the model refuses (it failed to load) is named in a 404; the base keeps serving.
    const refused = await client.chat.completions
      .create({ model: 'broken-adapter', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.NotFoundError);
    expect((refused as InstanceType<typeof OpenAI.NotFoundError>).message).toContain("'broken-adapter'");
    expect(
      (await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })).model,
    ).toBe('tiny');
  });
});

describe('completions and embeddings', () => {
  it('answers a completion, non-streaming and streaming, with OpenAI’s 16-token default', async () => {
    const out = await client.completions.create({ model: 'tiny', prompt: 'once upon a time', seed: 7 });
    expect(out.id).toMatch(/^cmpl-[0-9a-f]{24}$/);
    expect(out.object).toBe('text_completion');
    expect(out.choices).toEqual([
      { text: 's7-0 s7-1 s7-2 s7-3 s7-4', index: 0, logprobs: null, finish_reason: 'stop' },
    ]);
    expect(out.usage).toEqual({ prompt_tokens: 4, completion_tokens: 5, total_tokens: 9 });
    expect(tiny.calls[0]).toMatchObject({ kind: 'completion', prompt: 'once upon a time', maxTokens: 16, seed: 7 });

    const stream = await client.completions.create({
      model: 'tiny',
      prompt: ['once'],
      max_tokens: 2,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.text)).toEqual(['w0', ' w1', '', undefined]);
    expect(chunks.at(-2)?.choices[0]?.finish_reason).toBe('length');
    expect(chunks.at(-1)).toMatchObject({ object: 'text_completion', choices: [], usage: { total_tokens: 3 } });
  });

  it('embeds a string or an array of strings, as floats or as the base64 the client asks for by default', async () => {
    const embed = openAiClient(url, EMBED_KEY);
    // No encoding_format: the official client asks for base64 and decodes it.
    const one = await embed.embeddings.create({ model: 'embedder', input: 'hello world' });
    expect(one.object).toBe('list');
    expect(one.model).toBe('embedder');
    expect(one.data).toHaveLength(1);
    expect(one.data[0]?.object).toBe('embedding');
    expect(Array.from(one.data[0]?.embedding ?? [])).toEqual([11, 0.5, -0.25]);
    expect(one.usage).toEqual({ prompt_tokens: 2, total_tokens: 2 });

    const two = await embed.embeddings.create({ model: 'embedder', input: ['a', 'bcd e'], encoding_format: 'float' });
    expect(two.data.map((d) => [d.index, d.embedding])).toEqual([
      [0, [1, 0.5, -0.25]],
      [1, [5, 0.5, -0.25]],
    ]);
    expect(two.usage.prompt_tokens).toBe(3);

    const wrongWidth = await embed.embeddings
      .create({ model: 'embedder', input: 'a', dimensions: 8 })
      .catch((e: unknown) => e);
    expect(wrongWidth).toBeInstanceOf(OpenAI.BadRequestError);
    expect((wrongWidth as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('dimensions');

    const notEmbedder = await client.embeddings.create({ model: 'tiny', input: 'a' }).catch((e: unknown) => e);
    expect(notEmbedder).toBeInstanceOf(OpenAI.BadRequestError);
    expect((notEmbedder as InstanceType<typeof OpenAI.BadRequestError>).param).toBe('model');
  });

  it('lists the models and adapters the key may use, and only those', async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => m.id)).toEqual(['tiny', 'tiny-pirate', 'broken-adapter']);
    for (const m of page.data) {
      expect(m).toMatchObject({ object: 'model', owned_by: 'hangar' });
      expect(typeof m.created).toBe('number');
    }
    expect((await openAiClient(url, EMBED_KEY).models.list()).data.map((m) => m.id)).toEqual(['embedder']);
    expect((await client.models.retrieve('tiny-pirate')).id).toBe('tiny-pirate');
    await expect(client.models.retrieve('embedder')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });
});

describe('refusals in OpenAI’s shape', () => {
  async function raw(path: string, init: RequestInit = {}) {
    const res = await fetch(`${url}${path}`, init);
    return { status: res.status, body: (await res.json()) as { error: Record<string, unknown> } };
  }

  it('refuses a wrong or missing key with 401 invalid_api_key, and never logs the key', async () => {
    const wrong = await openAiClient(url, 'not-the-key')
      .chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(wrong).toBeInstanceOf(OpenAI.AuthenticationError);
    const err = wrong as InstanceType<typeof OpenAI.AuthenticationError>;
    expect(err.status).toBe(401);
    expect(err.code).toBe('invalid_api_key');
    expect(err.type).toBe('invalid_request_error');
    expect(err.message).not.toContain('not-the-key');

    // Another replica's key opens that replica only: the model is not found for it.
    const other = await openAiClient(url, EMBED_KEY)
      .chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(other).toBeInstanceOf(OpenAI.NotFoundError);
    expect(tiny.calls).toHaveLength(0);

    const missing = await raw('/v1/models');
    expect(missing.status).toBe(401);
    expect(missing.body).toEqual({
      error: {
        message: expect.stringContaining('Authorization: Bearer'),
        type: 'invalid_request_error',
        param: null,
        code: 'invalid_api_key',
      },
    });
    expect(logLines.join('\n')).not.toContain(KEY);
    expect(logLines.join('\n')).not.toContain('not-the-key');
  });

  it('refuses an unknown model with 404 model_not_found', async () => {
    const err = await client.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err).toMatchObject({ status: 404, code: 'model_not_found', param: 'model' });
    expect((err as Error).message).toContain('`gpt-4o` does not exist');
  });

  it('refuses an invalid field with 400 naming it in `param`', async () => {
    const bad = (body: Record<string, unknown>): Promise<InstanceType<typeof OpenAI.BadRequestError>> =>
      client.chat.completions
        .create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], ...body } as never)
        .then(
          (answer) => {
            throw new Error(`accepted ${JSON.stringify(body)}: ${JSON.stringify(answer)}`);
          },
          (e: unknown) => e as InstanceType<typeof OpenAI.BadRequestError>,
        );
    for (const [body, param] of [
      [{ temperature: 3 }, 'temperature'],
      [{ temperature: 'hot' }, 'temperature'],
      [{ top_p: 1.5 }, 'top_p'],
      [{ max_tokens: 0 }, 'max_tokens'],
      [{ max_completion_tokens: 2.5 }, 'max_completion_tokens'],
      [{ seed: 'abc' }, 'seed'],
      [{ stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
      [{ n: 2 }, 'n'],
      [{ stream_options: { include_usage: true } }, 'stream_options'],
      [{ messages: [{ role: 'wizard', content: 'x' }] }, 'messages[0].role'],
      [
        { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] },
        'messages[0].content',
      ],
      [{ messages: [{ role: 'user' }] }, 'messages[0].content'],
      [{ messages: [] }, 'messages'],
      [{ logprobs: true }, 'logprobs'],
      [{ tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools'],
    ] as const) {
      const err = await bad(body);
      expect(err, JSON.stringify(body)).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err.param, JSON.stringify(body)).toBe(param);
      expect(err.type).toBe('invalid_request_error');
    }
    const n = await bad({ n: 2 });
    expect(n.message).toContain('one choice per request');
    const missing = await client.chat.completions.create({ model: 'tiny' } as never).catch((e: unknown) => e);
    expect(missing).toMatchObject({ status: 400, param: 'messages', code: 'missing_required_parameter' });
    const prompt = await client.completions.create({ model: 'tiny', prompt: [1, 2, 3] }).catch((e: unknown) => e);
    expect(prompt).toMatchObject({ status: 400, param: 'prompt' });
    expect(tiny.calls).toHaveLength(0);

    // Unknown fields are ignored, as OpenAI ignores them.
    const ok = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'x' }],
      user: 'someone',
      frequency_penalty: 0,
      not_a_field: { deep: true },
    } as never);
    expect(ok.choices).toHaveLength(1);

    const json = await raw('/v1/chat/completions', {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: '{"model": "tiny", ',
    });
    expect(json.status).toBe(400);
    expect(json.body.error).toMatchObject({ type: 'invalid_request_error', message: expect.stringContaining('JSON') });
  });

  it('answers 429 when the model is busy, and the client raises RateLimitError', async () => {
    tiny.busy = true;
    const err = await client.chat.completions
      .create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], stream: true })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err).toMatchObject({ status: 429, code: 'rate_limit_exceeded' });
    expect((err as Error).message).toContain('queue is full');
  });

  it('ends a stream that fails midway with an error event, which the client raises, and logs the failure', async () => {
    tiny.failAfter = 2;
    const stream = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'x' }],
      stream: true,
    });
    const err = await readChatStream(stream).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as Error).message).toContain('The server had an error');
    // The model's own words stay in the node's log, not in the answer.
    expect((err as Error).message).not.toContain('llama_decode');
    expect(logLines.some((l) => l.includes('llama_decode failed'))).toBe(true);

    const whole = await client.chat.completions
      .create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(whole).toBeInstanceOf(OpenAI.InternalServerError);
    expect(whole).toMatchObject({ status: 500, type: 'server_error' });
  });

  it('answers 404 and 405 in OpenAI’s shape for other paths and methods', async () => {
    const missing = await raw('/v1/responses', { method: 'POST', headers: { authorization: `Bearer ${KEY}` } });
    expect(missing.status).toBe(404);
    expect(missing.body.error).toMatchObject({
      message: 'Invalid URL (POST /v1/responses)',
      type: 'invalid_request_error',
    });
    const method = await raw('/v1/chat/completions', { headers: { authorization: `Bearer ${KEY}` } });
    expect(method.status).toBe(405);
    expect(method.body.error.message).toContain('use POST');
    expect((await fetch(`${url}/health`)).status).toBe(200);
  });
});

describe('bodies and clients that misbehave', () => {
  it('refuses a body over the cap with 413', async () => {
    const err = await client.chat.completions
      .create({ model: 'tiny', messages: [{ role: 'user', content: 'x'.repeat(70 * 1024) }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err).toMatchObject({ status: 413, code: 'request_too_large' });

    // Without a content-length (a chunked body), counted as it arrives.
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode('{"model":"tiny","messages":[{"role":"user","content":"'));
        for (let i = 0; i < 20; i++) c.enqueue(new Uint8Array(8 * 1024).fill(0x78));
        c.enqueue(new TextEncoder().encode('"}]}'));
        c.close();
      },
    });
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body,
      duplex: 'half',
    } as RequestInit);
    expect(res.status).toBe(413);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('request_too_large');
    expect(tiny.calls).toHaveLength(0);
  });

  it('cuts off a body that never ends with 408 and closes the connection', async () => {
    const socket = net.connect(Number(new URL(url).port), '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => {
      answer += d.toString();
    });
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${KEY}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":`,
    );
    await closed;
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toContain('"code":"request_timeout"');
    expect(tiny.calls).toHaveLength(0);
  });

  it('aborts the model’s signal when a streaming client goes away mid-answer', async () => {
    tiny.endless = true;
    const stream = await client.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'talk forever' }],
      stream: true,
    });
    let pieces = 0;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta.content) pieces++;
      // Breaking out of the official client's stream aborts its request: the socket closes.
      if (pieces === 3) break;
    }
    await until('the model to see its signal aborted', () => tiny.aborted.length === 1);
    expect(tiny.aborted[0]?.signal.aborted).toBe(true);
  });

  it('aborts the model’s signal when a non-streaming client gives up before the answer', async () => {
    tiny.silent = true;
    const gaveUp = new AbortController();
    const pending = client.chat.completions
      .create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }, { signal: gaveUp.signal })
      .catch((e: unknown) => e);
    await until('the request to reach the model', () => tiny.calls.length === 1);
    gaveUp.abort();
    expect(await pending).toBeInstanceOf(OpenAI.APIUserAbortError);
    await until('the model to see its signal aborted', () => tiny.aborted.length === 1);
  });

  it('answers 503 for a request whose replica stopped under it, and 401 for its key once it is not served', async () => {
    tiny.silent = true;
    const pending = client.chat.completions
      .create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    await until('the request to reach the model', () => tiny.calls.length === 1);
    server.unserve('tiny');
    tiny.dispose();
    const err = await pending;
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err).toMatchObject({ status: 503, type: 'server_error' });
    expect((err as Error).message).toContain('stopped while answering');
    await expect(
      client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }),
    ).rejects.toThrow(/no longer runs on this node/);
  });

  it('frees what is being answered when the server closes', async () => {
    const own = createOpenAiServer({ log: createLogger('silent') });
    const model = new FakeModel('tiny');
    model.silent = true;
    own.serve(model, KEY);
    const ownUrl = await own.listen({ host: '127.0.0.1', port: 0 });
    const pending = openAiClient(ownUrl, KEY)
      .chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    await until('the request to reach the model', () => model.calls.length === 1);
    await own.close();
    expect(model.aborted).toHaveLength(1);
    expect(await pending).toBeInstanceOf(OpenAI.APIConnectionError);
  });
});
