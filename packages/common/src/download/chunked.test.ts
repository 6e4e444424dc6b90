import { describe, expect, it } from 'vitest';
import { bytes } from '../../test/fixtures/fault-upstream.js';
import { ChunkedDecoder, MalformedChunks } from './chunked.js';

/** Runs the decoder over `wire` cut into reads at the given points, the way a socket would deliver it. */
function decode(wire: Buffer, cuts: number[]): { body: Buffer; done: boolean; rest: number } {
  const buf = Buffer.from(wire); // decoded in place, like the download's buffer
  const d = new ChunkedDecoder();
  const parts: Buffer[] = [];
  const points = [0, ...cuts, wire.length];
  for (let i = 0; i + 1 < points.length; i++) {
    const from = points[i] as number;
    const to = points[i + 1] as number;
    const r = d.decode(buf, from, to);
    parts.push(Buffer.from(buf.subarray(from, r.end)));
    if (r.done) return { body: Buffer.concat(parts), done: true, rest: wire.length - to };
  }
  return { body: Buffer.concat(parts), done: false, rest: 0 };
}

const frame = (chunks: Buffer[], trailer = '') =>
  Buffer.concat([
    ...chunks.flatMap((c) => [Buffer.from(`${c.length.toString(16)}\r\n`), c, Buffer.from('\r\n')]),
    Buffer.from(`0\r\n${trailer}\r\n`),
  ]);

describe('the chunked transfer coding, undone in place', () => {
  const data = bytes(300, 7);
  const chunks = [data.subarray(0, 17), data.subarray(17, 200), data.subarray(200)];
  const wire = frame(chunks);

  it('gives the same bytes wherever the reads split the body', () => {
    for (let cut = 0; cut <= wire.length; cut++) {
      expect(decode(wire, [cut])).toEqual({ body: data, done: true, rest: 0 });
    }
    for (let a = 1; a < wire.length; a += 7) {
      for (let b = a; b < wire.length; b += 11) {
        expect(decode(wire, [a, b]).body).toEqual(data);
      }
    }
  });

  it('reads a byte at a time', () => {
    expect(
      decode(
        wire,
        Array.from({ length: wire.length - 1 }, (_, i) => i + 1),
      ),
    ).toEqual({
      body: data,
      done: true,
      rest: 0,
    });
  });

  it('skips chunk extensions and trailers, and takes upper-case hex', () => {
    const w = Buffer.concat([
      Buffer.from('B;name=value\r\n'),
      data.subarray(0, 11),
      Buffer.from('\r\n0\r\nDigest: sha-256=abc\r\nX-More: 1\r\n\r\n'),
    ]);
    expect(decode(w, [3, 20])).toEqual({ body: data.subarray(0, 11), done: true, rest: 0 });
  });

  it('stops at the end of the body, leaving what follows alone', () => {
    const w = Buffer.concat([frame([data.subarray(0, 5)]), Buffer.from('HTTP/1.1 200 OK')]);
    const r = decode(w, [w.length - 2]);
    expect(r.body).toEqual(data.subarray(0, 5));
    expect(r.done).toBe(true);
  });

  it('is not done while the last chunk is missing', () => {
    const cut = wire.subarray(0, wire.length - 5);
    expect(decode(cut, [])).toMatchObject({ done: false });
  });

  it.each([
    ['a size that is not hex', 'zz\r\nabc\r\n0\r\n\r\n', /not hexadecimal/],
    ['data longer than its size', '2\r\nabc\r\n0\r\n\r\n', /longer than its size/],
    ['a size line ended by LF alone', '3\nabc\r\n0\r\n\r\n', /not ended by CRLF/],
    ['a size over 2^52', '1ffffffffffffff\r\n', /over 2\^52/],
    ['an empty size', '\r\nabc', /not hexadecimal/],
  ])('refuses %s', (_, w, message) => {
    const d = new ChunkedDecoder();
    const buf = Buffer.from(w);
    expect(() => d.decode(buf, 0, buf.length)).toThrow(MalformedChunks);
    expect(() => new ChunkedDecoder().decode(Buffer.from(w), 0, w.length)).toThrow(message);
  });
});
