import { describe, expect, it } from 'vitest';
import { gguf, modelHeader } from '../../test/fixtures/gguf-writer.js';
import { knownTensorTypes } from './catalog.js';
import { factsOf } from './facts.js';
import { GgufError, readGguf } from './reader.js';
import type { ByteSource } from './source.js';

/** A source over a buffer that counts what was read, so "bounded" can be checked. */
function bufferSource(buf: Buffer, claimedSize = buf.length): ByteSource {
  const src: ByteSource = {
    size: claimedSize,
    bytesRead: 0,
    read: async (offset, length) => {
      const out = buf.subarray(offset, offset + length);
      src.bytesRead += out.length;
      return out;
    },
    close: async () => {},
  };
  return src;
}

const u64 = (n: bigint) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(n);
  return b;
};

describe('hostile GGUF headers are refused cleanly, within bounded memory', () => {
  const cases: [string, Buffer, RegExp][] = [
    ['bad magic', gguf([], [], { magic: 'GGML' }).header, /not a GGUF file/],
    ['version 1', gguf([], [], { version: 1 }).header, /version 1, which llama.cpp no longer loads/],
    ['version 99', gguf([], [], { version: 99 }).header, /version 99 is not one llama.cpp reads/],
    [
      'truncated',
      gguf([['general.architecture', 'str', 'llama']]).header.subarray(0, 30),
      /the file ends at byte \d+, inside the header/,
    ],
    [
      'a huge tensor count',
      Buffer.concat([Buffer.from('GGUF'), Buffer.from([3, 0, 0, 0]), u64(2n ** 40n), u64(0n)]),
      /claims 1099511627776 tensors/,
    ],
    [
      'a huge metadata count',
      Buffer.concat([Buffer.from('GGUF'), Buffer.from([3, 0, 0, 0]), u64(0n), u64(2n ** 62n)]),
      /metadata count is \d+: not a sane value|claims \d+ metadata entries/,
    ],
    [
      'a string longer than the file',
      Buffer.concat([
        Buffer.from('GGUF'),
        Buffer.from([3, 0, 0, 0]),
        u64(0n),
        u64(1n),
        u64(1n),
        Buffer.from('a'),
        Buffer.from([8, 0, 0, 0]),
        u64(1_000_000n),
        Buffer.from('x'),
      ]),
      /the value of a claims 1000000 bytes, past the end of the file/,
    ],
    [
      'an array of a billion items',
      Buffer.concat([
        Buffer.from('GGUF'),
        Buffer.from([3, 0, 0, 0]),
        u64(0n),
        u64(1n),
        u64(1n),
        Buffer.from('a'),
        Buffer.from([9, 0, 0, 0, 4, 0, 0, 0]),
        u64(1_000_000_000n),
      ]),
      /claims 1000000000 items/,
    ],
    [
      'an array of arrays',
      Buffer.concat([
        Buffer.from('GGUF'),
        Buffer.from([3, 0, 0, 0]),
        u64(0n),
        u64(1n),
        u64(1n),
        Buffer.from('a'),
        Buffer.from([9, 0, 0, 0, 9, 0, 0, 0]),
        u64(1n),
      ]),
      /array of arrays/,
    ],
    [
      'a tensor with five dimensions',
      gguf([], [{ name: 't', dims: [1, 1, 1, 1, 1], type: 0 }]).header,
      /has 5 dimensions/,
    ],
    [
      'an unknown tensor type',
      gguf([], [{ name: 't', dims: [32], type: 4 }]).header,
      /tensor type 4, which llama.cpp does not know/,
    ],
    [
      'a duplicate key',
      gguf([
        ['a', 'u32', 1],
        ['a', 'u32', 2],
      ]).header,
      /the metadata key a appears twice/,
    ],
  ];
  it.each(cases)('%s', async (_what, bytes, reason) => {
    const src = bufferSource(bytes);
    const err = await readGguf(src, knownTensorTypes).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GgufError);
    expect((err as Error).message).toMatch(reason);
    expect(src.bytesRead).toBeLessThanOrEqual(bytes.length);
  });

  it('stops at the header limit rather than following a file that claims endless metadata', async () => {
    // A million keys of 100 bytes each, served lazily: the reader gives up at its limit, not at the end.
    const key = Buffer.concat([u64(100n), Buffer.alloc(100, 97), Buffer.from([4, 0, 0, 0]), Buffer.alloc(4)]);
    const head = Buffer.concat([Buffer.from('GGUF'), Buffer.from([3, 0, 0, 0]), u64(0n), u64(60_000n)]);
    const src: ByteSource = {
      size: null,
      bytesRead: 0,
      read: async (offset, length) => {
        src.bytesRead += length;
        const out = Buffer.alloc(length);
        for (let i = 0; i < length; i++) {
          const at = offset + i;
          out[i] = at < head.length ? (head[at] ?? 0) : (key[(at - head.length) % key.length] ?? 0);
        }
        return out;
      },
      close: async () => {},
    };
    const err = await readGguf(src, knownTensorTypes).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/the metadata key a+ appears twice|larger than 64 MiB/);
    expect(src.bytesRead).toBeLessThan(80 << 20);
  });

  it('reads a generated model header with per-tensor sizes', async () => {
    const { header } = modelHeader({ arch: 'qwen3', layers: 4, embd: 256, heads: 8, kvHeads: 2 });
    const facts = factsOf(await readGguf(bufferSource(header, header.length + 10_000_000), knownTensorTypes));
    expect(facts).toMatchObject({
      architecture: 'qwen3',
      layers: 4,
      heads: 8,
      kvHeads: 2,
      keyLength: 32,
      fileType: 'Q4_K_M',
      tensorCount: 8,
    });
    expect(facts.parameterCount).toBe(4 * (256 * 256 + 256 * 1024));
    expect(facts.tensorBytes).toBe((facts.parameterCount / 256) * 144);
  });
});
