import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { describe, expect, it } from 'vitest';
import { SseTap } from './proxy.js';

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
