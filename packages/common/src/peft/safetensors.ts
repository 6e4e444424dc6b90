// The safetensors format (huggingface/safetensors): a u64 LE header length N, N bytes of JSON naming each tensor's
// dtype, shape and [begin, end) byte span in the data that follows. Adapters come from trainers on nodes, so the
// reader treats the file as hostile: every length and offset is checked before a byte of tensor data is used.
// Only the float dtypes a LoRA adapter holds are known; anything else is refused, not guessed at.

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

export type Dtype = 'F32' | 'F16' | 'BF16';

export const DTYPE_BYTES: Record<Dtype, number> = { F32: 4, F16: 2, BF16: 2 };

export type SafeTensor = {
  name: string;
  dtype: Dtype;
  /** Outermost first, as torch writes it: a Linear's weight is [out, in]. */
  shape: number[];
  /** A view into the file's buffer, not a copy. */
  data: Buffer;
};

export type Safetensors = { tensors: Map<string, SafeTensor>; metadata: Record<string, string> };

/** The safetensors library's own cap; a header that large is already far past any adapter's. */
export const MAX_HEADER_BYTES = 100 << 20;

/** A name as an error message shows it: the file chooses names, and one could be megabytes long. */
export const shown = (name: string) => (name.length > 120 ? `${name.slice(0, 120)}…` : name);

const isDtype = (d: unknown): d is Dtype => d === 'F32' || d === 'F16' || d === 'BF16';

/** Reads a whole safetensors file; throws SafetensorsError saying what is wrong and where. */
export function readSafetensors(file: Buffer): Safetensors {
  if (file.length < 8) throw new SafetensorsError(`the file is ${file.length} bytes, too short for a header length`);
  const declared = file.readBigUInt64LE(0);
  if (declared > BigInt(MAX_HEADER_BYTES))
    throw new SafetensorsError(`the header claims ${declared} bytes; at most ${MAX_HEADER_BYTES} are accepted`);
  const headerLen = Number(declared);
  if (8 + headerLen > file.length)
    throw new SafetensorsError(`the header claims ${headerLen} bytes but the file is ${file.length} (truncated?)`);

  let header: unknown;
  try {
    header = JSON.parse(file.toString('utf8', 8, 8 + headerLen));
  } catch (err) {
    throw new SafetensorsError(`the header is not JSON: ${(err as Error).message}`);
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header))
    throw new SafetensorsError('the header is not a JSON object of tensors');

  const dataStart = 8 + headerLen;
  const dataLen = file.length - dataStart;
  const tensors = new Map<string, SafeTensor>();
  const spans: { name: string; begin: number; end: number }[] = [];
  let metadata: Record<string, string> = {};

  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = readMetadata(entry);
      continue;
    }
    const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown } | null;
    if (typeof e !== 'object' || e === null)
      throw new SafetensorsError(`tensor ${shown(name)} is not described by an object`);
    if (!isDtype(e.dtype))
      throw new SafetensorsError(
        `tensor ${shown(name)} is ${JSON.stringify(e.dtype)}; only F32, F16 and BF16 are read`,
      );
    const shape = e.shape;
    if (!Array.isArray(shape) || shape.length > 8 || !shape.every((d) => Number.isSafeInteger(d) && d >= 0))
      throw new SafetensorsError(`tensor ${shown(name)} has shape ${JSON.stringify(shape)}: not a list of sizes`);
    const offsets = e.data_offsets;
    if (
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) ||
      offsets[0] > offsets[1]
    )
      throw new SafetensorsError(`tensor ${shown(name)} has data_offsets ${JSON.stringify(offsets)}: not [begin, end]`);
    const [begin, end] = offsets as [number, number];
    if (end > dataLen)
      throw new SafetensorsError(
        `tensor ${shown(name)} ends at byte ${end} of the data, which is only ${dataLen} bytes`,
      );
    // Products of safe integers can pass 2^53; the byte span is at most the file, so stop as soon as it is passed.
    let bytes = DTYPE_BYTES[e.dtype];
    for (const d of shape as number[]) {
      bytes *= d;
      if (bytes > dataLen) break;
    }
    if (bytes !== end - begin)
      throw new SafetensorsError(
        `tensor ${shown(name)} is ${e.dtype} ${JSON.stringify(shape)}, which needs ${bytes} bytes, but spans ${end - begin}`,
      );
    spans.push({ name, begin, end });
    tensors.set(name, {
      name,
      dtype: e.dtype,
      shape: shape as number[],
      data: file.subarray(dataStart + begin, dataStart + end),
    });
  }

  // Two tensors sharing bytes would let a writer of one silently change the other. Empty tensors hold no bytes.
  spans.sort((a, b) => a.begin - b.begin);
  let last: (typeof spans)[number] | undefined;
  for (const span of spans) {
    if (span.end === span.begin) continue;
    if (last && span.begin < last.end)
      throw new SafetensorsError(`tensors ${shown(last.name)} and ${shown(span.name)} overlap in the data`);
    if (!last || span.end > last.end) last = span;
  }
  return { tensors, metadata };
}

function readMetadata(entry: unknown): Record<string, string> {
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry))
    throw new SafetensorsError('__metadata__ is not an object');
  for (const [k, v] of Object.entries(entry))
    if (typeof v !== 'string') throw new SafetensorsError(`__metadata__.${shown(k)} is not a string`);
  return entry as Record<string, string>;
}

/** The tensor's values as float32, widening F16 and BF16 (little-endian, as the format stores them). */
export function toFloat32(t: Pick<SafeTensor, 'dtype' | 'data'>): Float32Array {
  const n = t.data.length / DTYPE_BYTES[t.dtype];
  const out = new Float32Array(n);
  if (t.dtype === 'F32') {
    // A copy, not a view: the data need not sit at a multiple of 4 in the file's buffer. Typed arrays use the
    // host's byte order, little-endian on every platform node-llama-cpp ships binaries for, as in the file.
    new Uint8Array(out.buffer).set(t.data);
  } else if (t.dtype === 'BF16') {
    // bfloat16 is the top half of a float32.
    const u = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) u[i] = t.data.readUInt16LE(i * 2) << 16;
  } else {
    for (let i = 0; i < n; i++) out[i] = halfToFloat(t.data.readUInt16LE(i * 2));
  }
  return out;
}

function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** float32 → IEEE half, rounding to nearest even; for writing F16 test data and base repositories. */
export function floatToHalf(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0]!;
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  const mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = (mant | 0x800000) >>> 0;
    const shift = 14 - e;
    const half = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (rest > mid || (rest === mid && half & 1) ? half + 1 : half);
  }
  const half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  return sign | (rest > 0x1000 || (rest === 0x1000 && half & 1) ? half + 1 : half);
}

export type TensorToWrite = { name: string; dtype: Dtype; shape: number[]; data: Buffer | Float32Array };

/**
 * Writes a safetensors file. A Float32Array is stored as the given dtype (F32, or rounded to F16); a Buffer is
 * taken as already encoded. The header is padded with spaces to 8 bytes, as the safetensors library does, so the
 * data starts aligned.
 */
export function writeSafetensors(tensors: TensorToWrite[], metadata?: Record<string, string>): Buffer {
  const bodies = tensors.map((t) => encode(t));
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let at = 0;
  for (const [i, t] of tensors.entries()) {
    const len = bodies[i]!.length;
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [at, at + len] };
    at += len;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Math.ceil(json.length / 8) * 8;
  json = Buffer.concat([json, Buffer.alloc(padded - json.length, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json, ...bodies]);
}

function encode(t: TensorToWrite): Buffer {
  const count = t.shape.reduce((a, b) => a * b, 1);
  if (Buffer.isBuffer(t.data)) {
    if (t.data.length !== count * DTYPE_BYTES[t.dtype])
      throw new SafetensorsError(`tensor ${t.name}: ${t.data.length} bytes for ${t.dtype} ${JSON.stringify(t.shape)}`);
    return t.data;
  }
  if (t.data.length !== count)
    throw new SafetensorsError(`tensor ${t.name}: ${t.data.length} values for shape ${JSON.stringify(t.shape)}`);
  if (t.dtype === 'F32') return Buffer.from(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  const out = Buffer.alloc(count * DTYPE_BYTES[t.dtype]);
  for (let i = 0; i < count; i++) {
    const v = t.data[i]!;
    if (t.dtype === 'F16') out.writeUInt16LE(floatToHalf(v), i * 2);
    else out.writeUInt16LE(bf16(v), i * 2);
  }
  return out;
}

/** float32 → bfloat16, rounding to nearest even. */
function bf16(x: number): number {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0]!;
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
