import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { bytes, sha256 } from '../../test/fixtures/fault-upstream.js';
import { Sha256 } from './sha256.js';

const shared = (b: Buffer) => {
  const s = Buffer.from(new SharedArrayBuffer(b.length + 10), 5, b.length); // at an offset inside its buffer
  b.copy(s);
  return s;
};

describe('sha256 on the hashing thread', () => {
  it('gives the digest node:crypto gives, block by block, shared or not', async () => {
    const data = bytes(3_000_000, 9);
    const h = new Sha256();
    await h.update(shared(data.subarray(0, 1_000_000)));
    await h.update(data.subarray(1_000_000, 2_000_000)); // an ordinary buffer is copied across
    expect(await h.digest()).toBe(sha256(data.subarray(0, 2_000_000)));
    await h.update(shared(data.subarray(2_000_000)));
    expect(await h.digest()).toBe(sha256(data));
    await h.close();
  });

  it('keeps streams apart, in the order their calls were made', async () => {
    const a = new Sha256();
    const b = new Sha256();
    const x = bytes(100_000, 1);
    const y = bytes(100_000, 2);
    await Promise.all([a.update(shared(x)), b.update(shared(y)), a.update(shared(y)), b.reset(), b.update(shared(x))]);
    expect(await a.digest()).toBe(createHash('sha256').update(x).update(y).digest('hex'));
    expect(await b.digest()).toBe(sha256(x));
    await Promise.all([a.close(), b.close()]);
  });

  it("picks up a partial file's bytes, and takes a missing file for none", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-sha-'));
    try {
      const data = bytes(2_500_000, 3);
      await fs.writeFile(path.join(dir, 'part'), data.subarray(0, 1_500_000));
      const h = new Sha256();
      expect(await h.addFile(path.join(dir, 'part'))).toBe(1_500_000);
      await h.update(shared(data.subarray(1_500_000)));
      expect(await h.digest()).toBe(sha256(data));
      const empty = new Sha256();
      expect(await empty.addFile(path.join(dir, 'missing'))).toBe(0);
      expect(await empty.digest()).toBe(sha256(Buffer.alloc(0)));
      await Promise.all([h.close(), empty.close()]);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });

  it('refuses a stream that was closed, rather than starting a new hash for it', async () => {
    const h = new Sha256();
    await h.close();
    await expect(h.update(shared(bytes(10)))).rejects.toThrow(/no sha256 stream/);
  });
});
