import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { describe, expect, it, vi } from 'vitest';
import { estimatePromptTokens, SseTap, UsageScanner, usageOfAnswer } from './proxy.js';

// The tap every streamed answer goes through, fed the bytes an engine sends cut at every place a read can cut
// them: inside a multi-byte character, inside the blank line that ends an event, inside the usage chunk. What
// comes out must be what went in, byte for byte, less only the usage chunk a client did not ask for.

const chunk = (delta: Record<string, unknown>) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
const usageChunk = `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } })}\n\n`;
const words = [chunk({ role: 'assistant', content: '' }), chunk({ content: ' héllo' }), chunk({ content: ' 🚀!' })];
const answer = Buffer.from(`${words.join('')}${usageChunk}data: [DONE]\n\n`);

async function through(tap: SseTap, reads: Buffer[]): Promise<Buffer> {
  const out: Buffer[] = [];
  await pipeline(Readable.from(reads), tap, async (source: AsyncIterable<Buffer | string>) => {
    for await (const piece of source) out.push(Buffer.from(piece));
  });
  return Buffer.concat(out);
}

/** The answer cut after every `size` bytes. */
const cut = (bytes: Buffer, size: number) =>
  Array.from({ length: Math.ceil(bytes.length / size) }, (_, i) => bytes.subarray(i * size, (i + 1) * size));

describe('SseTap', () => {
  for (const size of [1, 2, 3, 7, 64, answer.length]) {
    it(`passes the events on unchanged and reads the usage, with reads of ${size} bytes`, async () => {
      const kept = new SseTap(false);
      expect((await through(kept, cut(answer, size))).equals(answer)).toBe(true);
      expect(kept.usage).toEqual({ promptTokens: 5, completionTokens: 3 });

      const stripped = new SseTap(true);
      const out = await through(stripped, cut(answer, size));
      expect(out.toString('utf8')).toBe(`${words.join('')}data: [DONE]\n\n`);
      expect(stripped.usage).toEqual({ promptTokens: 5, completionTokens: 3 });
      expect(stripped.firstEventAt).not.toBeNull();
    });
  }

  it('passes on what an engine sent after its last whole event when the stream ends', async () => {
    const tap = new SseTap(true);
    const out = await through(tap, [Buffer.from(words[1] as string), Buffer.from('data: {"partial"')]);
    expect(out.toString('utf8')).toBe(`${words[1]}data: {"partial"`);
    expect(tap.usage).toBeNull();
  });
});

describe('SseTap when the usage chunk never comes', () => {
  it('accounts a token per chunk passed on that carried one, and the prompt estimated', async () => {
    const tap = new SseTap(true);
    // The role chunk, two tokens, the finish chunk: the client left before the usage chunk.
    const end = chunk({});
    await through(tap, [Buffer.from(`${words.join('')}${end}`)]);
    expect(tap.delivered).toBe(2);
    expect(tap.accounted(() => 11)).toEqual({ promptTokens: 11, completionTokens: 2 });
    const whole = new SseTap(true);
    await through(whole, cut(answer, 5));
    expect(whole.accounted(() => 11)).toEqual({ promptTokens: 5, completionTokens: 3 });
  });

  it('estimates a prompt at a token per 4 characters of its text, and one per token id', () => {
    expect(
      estimatePromptTokens({
        messages: [
          { role: 'system', content: 'abcd' },
          {
            role: 'user',
            content: [
              { type: 'text', text: 'efgh' },
              { type: 'image_url', image_url: { url: 'x' } },
            ],
          },
        ],
      }),
    ).toBe(2);
    expect(estimatePromptTokens({ prompt: [1, 2, 3] })).toBe(3);
    expect(estimatePromptTokens({ input: ['abcde', 'f'] })).toBe(2);
  });
});

// The scan of a JSON answer for its top-level usage, fed in pieces cut at every byte: a "usage" key nested deeper,
// braces and "usage" inside strings (escaped quotes included), and a usage that is not an object are not it.
describe('UsageScanner', () => {
  const usage = { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46 };
  const tricky = JSON.stringify({
    id: 'x',
    choices: [{ message: { content: 'a "usage":{"prompt_tokens":1} } { \\" and } ] [', usage: { prompt_tokens: 7 } } }],
    meta: { usage: { prompt_tokens: 8 } },
    'usage\\': { prompt_tokens: 9 },
    usages: { prompt_tokens: 10 },
    usage,
    after: [{ usage: 1 }],
  });

  for (const size of [1, 2, 3, 7, 64, tricky.length]) {
    it(`finds the top-level usage alone, with reads of ${size} bytes`, () => {
      const scanner = new UsageScanner();
      for (const piece of cut(Buffer.from(tricky), size)) scanner.push(piece);
      expect(scanner.usage).toEqual({ promptTokens: 12, completionTokens: 34 });
    });
  }

  it('finds none where the top-level usage is null or missing', () => {
    for (const text of ['{"usage":null,"data":[{"usage":{"prompt_tokens":3}}]}', '{"data":[]}', '[{"usage":{}}]']) {
      const scanner = new UsageScanner();
      scanner.push(Buffer.from(text));
      expect(scanner.usage).toBeNull();
    }
  });
});

describe('usageOfAnswer', () => {
  const text = 'A long answer. '.repeat(200);
  const completion = (extra: Record<string, unknown> = {}) => ({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
    ...extra,
  });
  const usage = {
    prompt_tokens: 9,
    completion_tokens: 7,
    total_tokens: 16,
    prompt_tokens_details: { cached_tokens: 4 },
  };

  it("reads an engine's usage from the answer's tail, parsing only the usage object", () => {
    const parse = vi.spyOn(JSON, 'parse');
    try {
      for (const answer of [JSON.stringify(completion({ usage })), JSON.stringify(completion({ usage }), null, 2)]) {
        parse.mockClear();
        expect(usageOfAnswer(Buffer.from(answer))).toEqual({ promptTokens: 9, completionTokens: 7, cachedTokens: 4 });
        // The answer is not parsed a second time: one parse, of the usage's few bytes.
        expect(parse.mock.calls.map(([arg]) => String(arg).length < 200)).toEqual([true]);
      }
    } finally {
      parse.mockRestore();
    }
  });

  it('takes only a top-level usage, wherever it is, as the whole parse does', () => {
    const cases: [unknown, unknown][] = [
      // Not last: the whole answer is parsed.
      [
        { usage, ...completion() },
        { promptTokens: 9, completionTokens: 7, cachedTokens: 4 },
      ],
      // A "usage" key deeper down, last in the answer, is not the answer's.
      [completion({ extra: { usage } }), null],
      [{ ...completion({ extra: { usage } }), usage: null }, null],
      // Inside the text it is escaped, never a key.
      [{ choices: [{ message: { content: 'say "usage":{"prompt_tokens":1}}' } }] }, null],
      [completion({ usage: null }), null],
    ];
    for (const [answer, expected] of cases) {
      expect(usageOfAnswer(Buffer.from(JSON.stringify(answer)))).toEqual(expected);
    }
  });
});
