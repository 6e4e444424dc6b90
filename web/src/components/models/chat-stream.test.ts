import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { CHAT_URL, type ChatStats, chatRequest, SseParser, streamChat, tokensPerSecond } from './chat-stream';

afterEach(() => {
  // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
  document.cookie = 'hangar_csrf=; max-age=0';
});

const chunk = (content: string, extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }], usage: null, ...extra })}\n\n`;
const finish = `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: 'length' }], usage: null })}\n\n`;
const usage = (completion: number) =>
  `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: completion, total_tokens: 5 + completion } })}\n\n`;
const DONE = 'data: [DONE]\n\n';

/**
 * A streamed answer delivered in exactly these pieces (bytes, so a piece may end inside a UTF-8 character), with
 * the clock moved 10 ms before each: the pieces a network read would hand over.
 */
function answerIn(pieces: (string | Uint8Array)[], clock: { t: number }, init: ResponseInit = {}) {
  const bytes = pieces.map((p) => (typeof p === 'string' ? new TextEncoder().encode(p) : p));
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      clock.t += 10;
      const next = bytes[i++];
      if (next) controller.enqueue(next);
      else controller.close();
    },
  });
  return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' }, ...init });
}

type Sent = { url: string; init: RequestInit };
const fetchAnswering = (response: () => Response | Promise<Response>, sent: Sent[] = []) =>
  (async (url: string, init: RequestInit) => {
    sent.push({ url, init });
    return response();
  }) as unknown as typeof fetch;

const request = chatRequest({ model: 'qwen3-8b', messages: [{ role: 'user', content: 'Hi' }] });

describe('SseParser', () => {
  const stream = `: keep-alive\r\n\r\ndata: {"a":1}\r\n\r\ndata: one\r\ndata: two\r\n\r\nevent: ping\nid: 7\ndata:no-space\n\n${DONE}`;
  const expected = ['{"a":1}', 'one\ntwo', 'no-space', '[DONE]'];

  it('reads the same events wherever the network splits the stream, even between a CR and its LF', () => {
    for (let cut = 0; cut <= stream.length; cut++) {
      const parser = new SseParser();
      const events = [...parser.push(stream.slice(0, cut)), ...parser.push(stream.slice(cut)), ...parser.finish()];
      expect(events, `split at ${cut}`).toEqual(expected);
    }
    // And one character at a time.
    const parser = new SseParser();
    const events = [...stream].flatMap((c) => parser.push(c));
    expect([...events, ...parser.finish()]).toEqual(expected);
  });

  it('keeps a last event the server closed without its blank line, and nothing for an empty stream', () => {
    const parser = new SseParser();
    expect(parser.push('data: {"a":1}\n\ndata: [DONE]')).toEqual(['{"a":1}']);
    expect(parser.finish()).toEqual(['[DONE]']);
    expect(new SseParser().finish()).toEqual([]);
  });
});

describe('streamChat', () => {
  it('sends the body the copied call shows, as the session (cookie and CSRF header) would', async () => {
    // biome-ignore lint/suspicious/noDocumentCookie: the test sets the cookie the server would set.
    document.cookie = 'hangar_csrf=csrf-123';
    const sent: Sent[] = [];
    const clock = { t: 0 };
    await streamChat({
      request: chatRequest({ model: 'support-tone', messages: [{ role: 'user', content: 'Hi' }], maxTokens: 64 }),
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(() => answerIn([chunk('Hello'), DONE], clock), sent),
      now: () => clock.t,
    });
    expect(sent).toHaveLength(1);
    expect(sent[0]?.url).toBe(CHAT_URL);
    expect(sent[0]?.init.method).toBe('POST');
    expect(sent[0]?.init.credentials).toBe('same-origin');
    expect(sent[0]?.init.headers).toMatchObject({ 'x-hangar-csrf': 'csrf-123', 'content-type': 'application/json' });
    expect(JSON.parse(sent[0]?.init.body as string)).toEqual({
      model: 'support-tone',
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 64,
      stream: true,
      stream_options: { include_usage: true },
    });
  });

  it('puts the text together across reads that split events, JSON and UTF-8 characters, and stops at [DONE]', async () => {
    const wire = new TextEncoder().encode(chunk('Grüß') + chunk(' dich') + finish + usage(7) + DONE + chunk('late'));
    // "ü" is two bytes: cut inside it, inside the JSON, and between the two newlines that end an event.
    const ue = wire.indexOf(0xc3) + 1;
    const cuts = [3, ue, ue + 9, wire.indexOf(10) + 1, wire.length - 20, wire.length];
    const pieces = cuts.map((end, i) => wire.slice(i === 0 ? 0 : (cuts[i - 1] as number), end));
    const clock = { t: 0 };
    const seen: [string, ChatStats][] = [];
    const outcome = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: (text, stats) => seen.push([text, stats]),
      fetchImpl: fetchAnswering(() => answerIn(pieces, clock)),
      now: () => clock.t,
    });
    expect(outcome.kind).toBe('done');
    // What came after [DONE] is not part of the answer.
    expect(outcome.text).toBe('Grüß dich');
    expect(seen.map(([text]) => text)).toEqual(['Grüß', 'Grüß dich', 'Grüß dich']);
    // Counted chunks until the engine's usage arrives, then the engine's count.
    expect(seen.map(([, s]) => [s.tokens, s.tokensFrom])).toEqual([
      [1, 'counted'],
      [2, 'counted'],
      [7, 'usage'],
    ]);
    if (outcome.kind !== 'done') return;
    expect(outcome.finishReason).toBe('length');
    expect(outcome.stats.tokens).toBe(7);
    expect(outcome.stats.firstTokenMs).toBeGreaterThan(0);
    expect(outcome.stats.tokensPerSecond).not.toBeNull();
  });

  it('says the OpenAI error body’s message when the gateway refuses', async () => {
    const body = JSON.stringify({
      error: {
        message: 'The model `nope` does not exist or you do not have access to it.',
        type: 'invalid_request_error',
        param: null,
        code: 'model_not_found',
      },
    });
    const outcome = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(
        () => new Response(body, { status: 404, headers: { 'content-type': 'application/json' } }),
      ),
    });
    expect(outcome).toMatchObject({
      kind: 'failed',
      text: '',
      message: 'The model `nope` does not exist or you do not have access to it.',
    });
  });

  it('says the status when the answer is not OpenAI’s shape, and what it got when it is not a stream', async () => {
    const proxy = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(
        () => new Response('<html>Bad Gateway</html>', { status: 502, statusText: 'Bad Gateway' }),
      ),
    });
    expect(proxy).toMatchObject({ kind: 'failed', message: 'The server answered 502 Bad Gateway' });
    const page = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(
        () => new Response('<!doctype html>', { status: 200, headers: { 'content-type': 'text/html' } }),
      ),
    });
    expect(page.kind).toBe('failed');
    if (page.kind === 'failed') expect(page.message).toMatch(/^The server answered text\/html instead of a stream/);
  });

  it('ends with the error event a replica sends mid-answer, keeping the text that arrived', async () => {
    const clock = { t: 0 };
    const error = `data: ${JSON.stringify({ error: { message: 'the replica went away mid-answer', type: 'server_error', param: null, code: null } })}\n\n`;
    const outcome = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(() => answerIn([chunk('Half'), error, chunk('never')], clock)),
      now: () => clock.t,
    });
    expect(outcome).toMatchObject({ kind: 'failed', text: 'Half', message: 'the replica went away mid-answer' });
  });

  it('fails a stream that ends without [DONE]: the answer may be cut short', async () => {
    const clock = { t: 0 };
    const outcome = await streamChat({
      request,
      signal: new AbortController().signal,
      onProgress: () => {},
      fetchImpl: fetchAnswering(() => answerIn([chunk('Cut')], clock)),
      now: () => clock.t,
    });
    expect(outcome.kind).toBe('failed');
    expect(outcome.text).toBe('Cut');
    if (outcome.kind === 'failed') expect(outcome.message).toMatch(/no \[DONE\]/);
  });

  it('stops on Stop: the connection is closed, and the text so far is kept', async () => {
    // A real socket, so that the abort is seen where it matters: the server's end of the connection closes.
    let closed!: () => void;
    const serverSawClose = new Promise<void>((r) => {
      closed = r;
    });
    const server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk('Once'));
      const more = setInterval(() => res.write(chunk(' more')), 20);
      res.on('close', () => {
        clearInterval(more);
        closed();
      });
      req.resume();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const stop = new AbortController();
      const outcome = await streamChat({
        request,
        signal: stop.signal,
        onProgress: (text) => {
          if (text.length > 'Once more more'.length) stop.abort();
        },
        fetchImpl: ((url: string, init: RequestInit) => fetch(base + url, init)) as typeof fetch,
      });
      expect(outcome.kind).toBe('stopped');
      expect(outcome.text).toMatch(/^Once( more){3,}$/);
      await serverSawClose;
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });
});

describe('tokensPerSecond', () => {
  it('counts the tokens after the first over the time after the first, as the smoke test does', () => {
    // 11 tokens, the first at 200 ms, the last at 1200 ms: 10 tokens in a second.
    expect(tokensPerSecond(11, 0, 200, 1200)).toBe(10);
    // One token: over the whole request.
    expect(tokensPerSecond(1, 0, 250, 250)).toBe(4);
    expect(tokensPerSecond(0, 0, null, 500)).toBeNull();
  });
});
