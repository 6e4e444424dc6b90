import type { ByteSource } from './source.js';

// A bounded GGUF header reader. It reads only the header (metadata and tensor descriptions), never tensor data,
// and treats the file as hostile: every count and length is checked against sane limits and against what is
// left of the file before anything is allocated, so a crafted header cannot make it read or hold much.

export class GgufError extends Error {
  override name = 'GgufError';
}

export const LIMITS = {
  /** The most header bytes read; a 150k-token vocabulary with merges is under 10 MiB. */
  headerBytes: 64 << 20,
  keyBytes: 64 << 10,
  stringBytes: 16 << 20,
  arrayItems: 1 << 24,
  kvCount: 1 << 16,
  tensorCount: 1 << 20,
  /** Values of arrays longer than this are skipped (their length is kept): tokens, scores, merges. */
  keptArrayItems: 1024,
  keptStringBytes: 64 << 10,
};

export type GgufValue = number | bigint | boolean | string | GgufValue[] | { skippedArray: number; itemType: number };

export type GgufTensor = { name: string; dims: number[]; type: number; offset: bigint };

export type GgufHeader = {
  version: number;
  metadata: Map<string, GgufValue>;
  tensors: GgufTensor[];
  /** Where the header ends (the tensor data starts at this, padded to the alignment). */
  headerBytes: number;
};

const T = {
  U8: 0,
  I8: 1,
  U16: 2,
  I16: 3,
  U32: 4,
  I32: 5,
  F32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  U64: 10,
  I64: 11,
  F64: 12,
} as const;
const fixedSize: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

class Cursor {
  private buf = Buffer.alloc(0);
  private bufStart = 0;
  pos = 0;
  private chunk = 256 << 10;
  constructor(private readonly src: ByteSource) {}

  private remainingInFile() {
    return this.src.size === null ? Number.POSITIVE_INFINITY : this.src.size - this.pos;
  }

  /** Makes n bytes at pos available, reading ahead in growing pieces; refuses to pass the header limit. */
  private async ensure(n: number) {
    if (this.pos + n > LIMITS.headerBytes) {
      throw new GgufError(`the header is larger than ${LIMITS.headerBytes >> 20} MiB: refused as not a sane GGUF`);
    }
    const have = this.bufStart + this.buf.length - this.pos;
    if (have >= n) return;
    // Drop what was consumed, so memory stays at about one read-ahead piece.
    const keepFrom = this.pos - this.bufStart;
    let next = this.buf.subarray(keepFrom);
    let at = this.pos + next.length;
    while (next.length < n) {
      const want = Math.max(n - next.length, this.chunk);
      const got = await this.src.read(at, want);
      if (got.length === 0) throw new GgufError(`the file ends at byte ${at}, inside the header (truncated?)`);
      next = Buffer.concat([next, got]);
      at += got.length;
      this.chunk = Math.min(this.chunk * 2, 8 << 20);
    }
    this.buf = next;
    this.bufStart = this.pos;
  }

  private async take(n: number): Promise<Buffer> {
    await this.ensure(n);
    const off = this.pos - this.bufStart;
    this.pos += n;
    return this.buf.subarray(off, off + n);
  }

  async skip(n: number) {
    // Skipping still reads: a source has no cheaper way to prove the bytes are there.
    while (n > 0) {
      const step = Math.min(n, 1 << 20);
      await this.take(step);
      n -= step;
    }
  }

  /**
   * Skips n length-prefixed strings. A vocabulary is 150k of them, so this walks the buffer in a plain loop and
   * only awaits when it needs more bytes, instead of an await per token.
   */
  async skipStrings(n: number, what: string) {
    for (let i = 0; i < n; ) {
      const off = this.pos - this.bufStart;
      const avail = this.buf.length - off;
      if (avail >= 8) {
        const len = this.buf.readBigUInt64LE(off);
        if (len > BigInt(LIMITS.stringBytes))
          throw new GgufError(`item ${i} of ${what} claims ${len} bytes; at most ${LIMITS.stringBytes} are accepted`);
        if (avail >= 8 + Number(len)) {
          this.pos += 8 + Number(len);
          i++;
          continue;
        }
      }
      await this.string(LIMITS.stringBytes, `item ${i} of ${what}`, false);
      i++;
    }
  }

  async u32() {
    return (await this.take(4)).readUInt32LE(0);
  }
  async i32() {
    return (await this.take(4)).readInt32LE(0);
  }
  async u64(what: string): Promise<number> {
    const v = (await this.take(8)).readBigUInt64LE(0);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new GgufError(`${what} is ${v}: not a sane value`);
    return Number(v);
  }
  async u64big() {
    return (await this.take(8)).readBigUInt64LE(0);
  }
  async i64big() {
    return (await this.take(8)).readBigInt64LE(0);
  }

  async string(limit: number, what: string, keep = true): Promise<string> {
    const len = await this.u64(`the length of ${what}`);
    if (len > limit) throw new GgufError(`${what} claims ${len} bytes; at most ${limit} are accepted`);
    if (len > this.remainingInFile()) throw new GgufError(`${what} claims ${len} bytes, past the end of the file`);
    if (!keep || len > LIMITS.keptStringBytes) {
      await this.skip(len);
      return keep ? '' : '';
    }
    return (await this.take(len)).toString('utf8');
  }

  async scalar(type: number): Promise<number | bigint | boolean> {
    const b = await this.take(fixedSize[type] ?? 0);
    switch (type) {
      case T.U8:
        return b.readUInt8(0);
      case T.I8:
        return b.readInt8(0);
      case T.U16:
        return b.readUInt16LE(0);
      case T.I16:
        return b.readInt16LE(0);
      case T.U32:
        return b.readUInt32LE(0);
      case T.I32:
        return b.readInt32LE(0);
      case T.F32:
        return b.readFloatLE(0);
      case T.BOOL:
        return b.readUInt8(0) !== 0;
      case T.U64:
        return b.readBigUInt64LE(0);
      case T.I64:
        return b.readBigInt64LE(0);
      case T.F64:
        return b.readDoubleLE(0);
      default:
        throw new GgufError(`unknown value type ${type}`);
    }
  }
}

async function readValue(c: Cursor, type: number, key: string): Promise<GgufValue> {
  if (type === T.STRING) return c.string(LIMITS.stringBytes, `the value of ${key}`);
  if (type === T.ARRAY) {
    const itemType = await c.i32();
    const n = await c.u64(`the length of ${key}`);
    if (n > LIMITS.arrayItems)
      throw new GgufError(`${key} claims ${n} items; at most ${LIMITS.arrayItems} are accepted`);
    if (itemType === T.ARRAY) throw new GgufError(`${key} is an array of arrays, which GGUF does not allow`);
    if (itemType !== T.STRING && fixedSize[itemType] === undefined)
      throw new GgufError(`${key} has items of unknown type ${itemType}`);
    const keep = n <= LIMITS.keptArrayItems;
    if (itemType !== T.STRING) {
      const bytes = n * (fixedSize[itemType] ?? 1);
      if (!keep) {
        await c.skip(bytes);
        return { skippedArray: n, itemType };
      }
    }
    if (itemType === T.STRING && !keep) {
      await c.skipStrings(n, key);
      return { skippedArray: n, itemType };
    }
    const out: GgufValue[] = [];
    for (let i = 0; i < n; i++) {
      if (itemType === T.STRING) {
        const s = await c.string(LIMITS.stringBytes, `item ${i} of ${key}`, keep);
        if (keep) out.push(s);
      } else {
        out.push(await c.scalar(itemType));
      }
    }
    return keep ? out : { skippedArray: n, itemType };
  }
  if (fixedSize[type] === undefined) throw new GgufError(`${key} has unknown value type ${type}`);
  return c.scalar(type);
}

/** Reads a GGUF header from a source; throws GgufError with a plain reason for anything malformed or hostile. */
export async function readGguf(src: ByteSource, knownTypes: ReadonlySet<number>): Promise<GgufHeader> {
  const c = new Cursor(src);
  const magic = (await c.u32()) >>> 0;
  if (magic !== 0x46554747) throw new GgufError('not a GGUF file (its first bytes are not "GGUF")');
  const version = await c.u32();
  if (version === 1) throw new GgufError('GGUF version 1, which llama.cpp no longer loads: convert the model again');
  if (version !== 2 && version !== 3)
    throw new GgufError(`GGUF version ${version} is not one llama.cpp reads (2 and 3 are)`);
  const tensorCount = await c.u64('the tensor count');
  const kvCount = await c.u64('the metadata count');
  if (tensorCount > LIMITS.tensorCount)
    throw new GgufError(`the header claims ${tensorCount} tensors; at most ${LIMITS.tensorCount} are accepted`);
  if (kvCount > LIMITS.kvCount)
    throw new GgufError(`the header claims ${kvCount} metadata entries; at most ${LIMITS.kvCount} are accepted`);

  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < kvCount; i++) {
    const key = await c.string(LIMITS.keyBytes, `metadata key ${i}`);
    if (metadata.has(key)) throw new GgufError(`the metadata key ${key} appears twice`);
    const type = await c.i32();
    metadata.set(key, await readValue(c, type, key));
  }
  const tensors: GgufTensor[] = [];
  const names = new Set<string>();
  for (let i = 0; i < tensorCount; i++) {
    const name = await c.string(256, `the name of tensor ${i}`);
    if (names.has(name)) throw new GgufError(`tensor ${name} appears twice`);
    names.add(name);
    const nDims = await c.u32();
    if (nDims > 4) throw new GgufError(`tensor ${name} has ${nDims} dimensions; llama.cpp allows at most 4`);
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) {
      const ne = await c.i64big();
      if (ne < 0n || ne > BigInt(Number.MAX_SAFE_INTEGER))
        throw new GgufError(`tensor ${name} has a dimension of ${ne}`);
      dims.push(Number(ne));
    }
    const type = await c.u32();
    if (!knownTypes.has(type))
      throw new GgufError(`tensor ${name} has tensor type ${type}, which llama.cpp does not know`);
    const offset = await c.u64big();
    tensors.push({ name, dims, type, offset });
  }
  return { version, metadata, tensors, headerBytes: c.pos };
}
