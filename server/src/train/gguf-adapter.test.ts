import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { knownTensorTypes } from '@hangar/common/gguf/catalog';
import { type GgufHeader, readGguf } from '@hangar/common/gguf/reader';
import type { ByteSource } from '@hangar/common/gguf/source';
import { type AdapterBase, AdapterConversionError, peftToGguf } from '@hangar/common/peft/gguf-adapter';
import {
  type Dtype,
  readSafetensors,
  SafetensorsError,
  type TensorToWrite,
  toFloat32,
  writeSafetensors,
} from '@hangar/common/peft/safetensors';
import { TINY_LLAMA, tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import type { Llama, LlamaModel, Token } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cpuLlama, greedy, logitsAt, maxDiff, promptTokens } from '../../test/fixtures/llama-lora.js';

// --- building PEFT adapters -------------------------------------------------------------------------------------

/** A fixed-seed generator of uniform values in [-amp, amp): the same adapter every run. */
function uniform(seed: number) {
  let x = (seed * 2654435761) >>> 0;
  return (n: number, amp: number) => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
      out[i] = (x / 2 ** 32 - 0.5) * 2 * amp;
    }
    return out;
  };
}

/** One LoRA pair in PEFT's orientation: A [r, in], B [out, r] (for an embedding, A [r, vocab], B [embd, r]). */
type PeftPair = {
  module: string;
  embedding?: boolean;
  r: number;
  inDim: number;
  outDim: number;
  a: Float32Array;
  b: Float32Array;
};

const llamaBase: AdapterBase = { architecture: 'llama', headCount: TINY_LLAMA.heads, headCountKv: TINY_LLAMA.kvHeads };

function loraConfig(over: Record<string, unknown> = {}) {
  return {
    peft_type: 'LORA',
    r: 4,
    lora_alpha: 8,
    lora_dropout: 0,
    target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
    task_type: 'CAUSAL_LM',
    bias: 'none',
    use_dora: false,
    use_rslora: false,
    fan_in_fan_out: false,
    modules_to_save: null,
    ...over,
  };
}

function keysOf(p: PeftPair) {
  return p.embedding
    ? [`base_model.model.${p.module}.lora_embedding_A`, `base_model.model.${p.module}.lora_embedding_B`]
    : [`base_model.model.${p.module}.lora_A.weight`, `base_model.model.${p.module}.lora_B.weight`];
}

function safetensorsOf(pairs: PeftPair[], dtype: Dtype = 'F32', extra: TensorToWrite[] = []): Buffer {
  const list: TensorToWrite[] = [];
  for (const p of pairs) {
    const [ka, kb] = keysOf(p);
    list.push({ name: ka!, dtype, shape: [p.r, p.inDim], data: p.a });
    list.push({ name: kb!, dtype, shape: [p.outDim, p.r], data: p.b });
  }
  return writeSafetensors([...list, ...extra], { format: 'pt' });
}

/** Every linear the tiny llama has, both layers: [PEFT module, in, out]. */
function tinyLinears(): [string, number, number][] {
  const { embd, ff, layers } = TINY_LLAMA;
  const out: [string, number, number][] = [];
  for (let l = 0; l < layers; l++) {
    const p = `model.layers.${l}`;
    out.push(
      [`${p}.self_attn.q_proj`, embd, embd],
      [`${p}.self_attn.k_proj`, embd, embd],
      [`${p}.self_attn.v_proj`, embd, embd],
      [`${p}.self_attn.o_proj`, embd, embd],
      [`${p}.mlp.gate_proj`, embd, ff],
      [`${p}.mlp.up_proj`, embd, ff],
      [`${p}.mlp.down_proj`, ff, embd],
    );
  }
  return out;
}

/**
 * Random, non-zero A and B for the given modules. The amplitude makes (alpha/r)·B·A about as large as the tiny
 * model's own weights (±0.08), so the adapter visibly moves the logits, and a misplaced row moves them differently.
 * Values are rounded to F16 once, so the same adapter stored as F32 or F16 holds the very same numbers.
 */
function randomPairs(seed: number, r: number, modules: [string, number, number][], amp = 0.2): PeftPair[] {
  const rand = uniform(seed);
  const f16 = (v: Float32Array) =>
    toFloat32(
      readSafetensors(writeSafetensors([{ name: 'x', dtype: 'F16', shape: [v.length], data: v }])).tensors.get('x')!,
    );
  return modules.map(([module, inDim, outDim]) => ({
    module,
    r,
    inDim,
    outDim,
    a: f16(rand(r * inDim, amp)),
    b: f16(rand(outDim * r, amp)),
  }));
}

// --- reading the GGUF back with the server's own reader -------------------------------------------------------------

const bufferSource = (b: Buffer): ByteSource => ({
  size: b.length,
  bytesRead: 0,
  read: async (offset, length) => b.subarray(offset, offset + length),
  close: async () => {},
});

async function readBack(file: Buffer) {
  const header = await readGguf(bufferSource(file), knownTensorTypes);
  const dataStart = Math.ceil(header.headerBytes / 32) * 32;
  const bytes = (t: GgufHeader['tensors'][number]) => t.dims.reduce((p, d) => p * d, 1) * (t.type === 0 ? 4 : 2);
  const data = (name: string) => {
    const t = header.tensors.find((x) => x.name === name);
    if (!t) throw new Error(`no tensor ${name}`);
    return file.subarray(dataStart + Number(t.offset), dataStart + Number(t.offset) + bytes(t));
  };
  const f32 = (name: string) => toFloat32({ dtype: 'F32', data: data(name) });
  return { header, dataStart, bytes, data, f32 };
}

const convert = (pairs: PeftPair[], o: { config?: Record<string, unknown>; dtype?: Dtype; base?: AdapterBase } = {}) =>
  peftToGguf({ config: loraConfig(o.config), safetensors: safetensorsOf(pairs, o.dtype), base: o.base ?? llamaBase });

const refusal = (input: Parameters<typeof peftToGguf>[0]) => {
  try {
    peftToGguf(input);
  } catch (err) {
    expect(err).toBeInstanceOf(AdapterConversionError);
    return (err as Error).message;
  }
  throw new Error('converted, but a refusal was expected');
};

// --- the format -------------------------------------------------------------------------------------------------

describe('the GGUF adapter', () => {
  it('has the metadata llama.cpp checks, names and shapes it pairs, and offsets it requires', async () => {
    const pairs = randomPairs(1, 4, [
      ['model.layers.1.mlp.down_proj', 128, 64],
      ['model.layers.0.self_attn.q_proj', 64, 64],
      ['lm_head', 64, 32000],
    ]);
    const file = convert(pairs);
    const { header, dataStart, bytes } = await readBack(file);

    expect(header.version).toBe(3);
    expect([...header.metadata]).toEqual([
      ['general.architecture', 'llama'],
      ['general.type', 'adapter'],
      ['adapter.type', 'lora'],
      ['adapter.lora.alpha', 8],
      ['general.quantization_version', 2],
    ]);
    // Layers in order, the output last; each pair lora_a then lora_b; shapes innermost first: A [in, r], B [r, out].
    expect(header.tensors.map((t) => [t.name, t.dims, t.type])).toEqual([
      ['blk.0.attn_q.weight.lora_a', [64, 4], 0],
      ['blk.0.attn_q.weight.lora_b', [4, 64], 0],
      ['blk.1.ffn_down.weight.lora_a', [128, 4], 0],
      ['blk.1.ffn_down.weight.lora_b', [4, 64], 0],
      ['output.weight.lora_a', [64, 4], 0],
      ['output.weight.lora_b', [4, 32000], 0],
    ]);
    // llama.cpp wants each tensor at Σ PAD(nbytes, 32) of those before it, from the header padded to 32.
    let expected = 0;
    for (const t of header.tensors) {
      expect(Number(t.offset)).toBe(expected);
      expected += Math.ceil(bytes(t) / 32) * 32;
    }
    expect(dataStart % 32).toBe(0);
    expect(file.length).toBe(dataStart + expected);
    expect(file.subarray(header.headerBytes, dataStart).every((b) => b === 0)).toBe(true);
  });

  it('writes the values as they are: A and B untransposed, F32 kept F32, F16 kept F16, BF16 widened to F32', async () => {
    const [pair] = randomPairs(2, 4, [['model.layers.0.mlp.up_proj', 64, 128]]);
    const a32 = await readBack(convert([pair!]));
    expect(a32.f32('blk.0.ffn_up.weight.lora_a')).toEqual(pair!.a);
    expect(a32.f32('blk.0.ffn_up.weight.lora_b')).toEqual(pair!.b);

    const f16 = await readBack(convert([pair!], { dtype: 'F16' }));
    expect(f16.header.tensors.map((t) => t.type)).toEqual([1, 1]);
    expect(toFloat32({ dtype: 'F16', data: f16.data('blk.0.ffn_up.weight.lora_b') })).toEqual(pair!.b);

    const bf16 = await readBack(convert([pair!], { dtype: 'BF16' }));
    expect(bf16.header.tensors.map((t) => t.type)).toEqual([0, 0]);
    const viaBf16 = readSafetensors(safetensorsOf([pair!], 'BF16')).tensors.get(keysOf(pair!)[1]!)!;
    expect(bf16.f32('blk.0.ffn_up.weight.lora_b')).toEqual(toFloat32(viaBf16));

    // A in F16 and B in F32: one type for the pair, the wider.
    const st = writeSafetensors([
      { name: keysOf(pair!)[0]!, dtype: 'F16', shape: [4, 64], data: pair!.a },
      { name: keysOf(pair!)[1]!, dtype: 'F32', shape: [128, 4], data: pair!.b },
    ]);
    const mixed = await readBack(peftToGguf({ config: loraConfig(), safetensors: st, base: llamaBase }));
    expect(mixed.header.tensors.map((t) => t.type)).toEqual([0, 0]);
    expect(mixed.f32('blk.0.ffn_up.weight.lora_a')).toEqual(pair!.a);
  });

  it("reorders llama's q/k lora_b rows within heads (q by head count, k by kv head count), and nothing else", async () => {
    // B's row i holds i in every column, so where each row went can be read off.
    const rowsB = (rows: number, r: number) => Float32Array.from({ length: rows * r }, (_, k) => Math.floor(k / r));
    const colsA = (r: number, inDim: number) => Float32Array.from({ length: r * inDim }, (_, k) => k);
    const pair = (proj: string, out: number): PeftPair => ({
      module: `model.layers.0.self_attn.${proj}`,
      r: 2,
      inDim: 8,
      outDim: out,
      a: colsA(2, 8),
      b: rowsB(out, 2),
    });
    const pairs = [pair('q_proj', 8), pair('k_proj', 4), pair('v_proj', 4)];
    const base = { architecture: 'llama', headCount: 2, headCountKv: 1 };
    const rowOrder = (f: Float32Array) => Array.from({ length: f.length / 2 }, (_, i) => f[i * 2]);
    const got = await readBack(convert(pairs, { base, config: { r: 2 } }));

    // torch: B.reshape(h, 2, out/h/2, r).swapaxes(1, 2).reshape(out, r). q: 2 heads of 4 rows; k: 1 head of 4.
    expect(rowOrder(got.f32('blk.0.attn_q.weight.lora_b'))).toEqual([0, 2, 1, 3, 4, 6, 5, 7]);
    expect(rowOrder(got.f32('blk.0.attn_k.weight.lora_b'))).toEqual([0, 2, 1, 3]);
    expect(rowOrder(got.f32('blk.0.attn_v.weight.lora_b'))).toEqual([0, 1, 2, 3]);
    expect(got.f32('blk.0.attn_q.weight.lora_a')).toEqual(colsA(2, 8));

    // mistral3 derives from llama's converter; qwen2 is converted without the reordering.
    const ministral = await readBack(convert(pairs, { base: { ...base, architecture: 'mistral3' }, config: { r: 2 } }));
    expect(rowOrder(ministral.f32('blk.0.attn_q.weight.lora_b'))).toEqual([0, 2, 1, 3, 4, 6, 5, 7]);
    const qwen = await readBack(convert(pairs, { base: { ...base, architecture: 'qwen2' }, config: { r: 2 } }));
    expect(rowOrder(qwen.f32('blk.0.attn_q.weight.lora_b'))).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(qwen.header.metadata.get('general.architecture')).toBe('qwen2');
  });

  it('writes a token-embedding LoRA with A transposed to [vocab, r], as llama.cpp picks its rows by token', async () => {
    const a = Float32Array.from({ length: 2 * 3 }, (_, k) => k); // [r=2, vocab=3]: rows [0 1 2], [3 4 5]
    const b = Float32Array.from({ length: 4 * 2 }, (_, k) => 10 + k); // [embd=4, r=2]
    const pairs = [{ module: 'model.embed_tokens', embedding: true, r: 2, inDim: 3, outDim: 4, a, b }];
    const got = await readBack(convert(pairs, { config: { r: 2 } }));
    expect(got.header.tensors.map((t) => [t.name, t.dims])).toEqual([
      ['token_embd.weight.lora_a', [2, 3]],
      ['token_embd.weight.lora_b', [2, 4]],
    ]);
    expect([...got.f32('token_embd.weight.lora_a')]).toEqual([0, 3, 1, 4, 2, 5]);
    expect(got.f32('token_embd.weight.lora_b')).toEqual(b);
  });

  it('writes alpha·√r for rsLoRA, so that llama.cpp’s alpha/r is rsLoRA’s alpha/√r', async () => {
    const pairs = randomPairs(3, 4, [['model.layers.0.self_attn.v_proj', 64, 64]]);
    const got = await readBack(convert(pairs, { config: { use_rslora: true, r: 4, lora_alpha: 8 } }));
    expect(got.header.metadata.get('adapter.lora.alpha')).toBe(16);
  });

  it('is the same bytes for the same adapter, whatever order the safetensors keys come in', () => {
    const pairs = randomPairs(4, 4, tinyLinears());
    expect(convert(pairs).equals(convert([...pairs].reverse()))).toBe(true);
  });
});

describe('adapters that are refused, with the reason', () => {
  const pairs = randomPairs(5, 4, [
    ['model.layers.0.self_attn.q_proj', 64, 64],
    ['model.layers.0.mlp.down_proj', 128, 64],
  ]);
  const input = (config: Record<string, unknown> = {}, extra: TensorToWrite[] = [], list = pairs) => ({
    config: loraConfig(config),
    safetensors: safetensorsOf(list, 'F32', extra),
    base: llamaBase,
  });
  const vec = (name: string, shape: number[]): TensorToWrite => ({
    name,
    dtype: 'F32',
    shape,
    data: new Float32Array(shape.reduce((p, d) => p * d, 1)),
  });

  it.each([
    ['DoRA in the config', input({ use_dora: true }), /DoRA \(use_dora\)/],
    [
      'DoRA magnitude vectors',
      input({}, [vec('base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector', [64])]),
      /DoRA magnitude vector/,
    ],
    ['modules_to_save in the config', input({ modules_to_save: ['lm_head'] }), /modules_to_save \["lm_head"\]/],
    [
      'a full weight saved with the adapter',
      input({}, [vec('base_model.model.lm_head.weight', [32000, 64])]),
      /lm_head\.weight is a full weight/,
    ],
    [
      'a modules_to_save copy',
      input({}, [vec('base_model.model.lm_head.modules_to_save.weight', [32000, 64])]),
      /whole module saved with the adapter/,
    ],
    ['alpha_pattern', input({ alpha_pattern: { q_proj: 16 } }), /alpha_pattern or rank_pattern/],
    ['rank_pattern', input({ rank_pattern: { q_proj: 8 } }), /alpha_pattern or rank_pattern/],
    ['trained biases in the config', input({ bias: 'all' }), /trains biases \(bias "all"\)/],
    [
      'a bias tensor',
      input({}, [vec('base_model.model.model.layers.0.self_attn.q_proj.bias', [64])]),
      /q_proj\.bias is a bias/,
    ],
    ['fan_in_fan_out', input({ fan_in_fan_out: true }), /fan_in_fan_out/],
    ['another PEFT method', input({ peft_type: 'LOHA' }), /peft_type "LOHA": only LORA/],
    ['no lora_alpha', input({ lora_alpha: undefined }), /lora_alpha undefined: a positive number/],
    ['a rank of 0', input({ r: 0 }), /r 0: a positive whole rank/],
    [
      'a module llama.cpp has no tensor for',
      input({}, [], randomPairs(6, 4, [['model.layers.0.self_attn.rotary_emb', 64, 64]])),
      /adapts model\.layers\.0\.self_attn\.rotary_emb, which is not converted: supported are q_proj/,
    ],
    [
      'a projection under the wrong parent',
      input({}, [], randomPairs(6, 4, [['model.layers.0.mlp.q_proj', 64, 64]])),
      /adapts model\.layers\.0\.mlp\.q_proj, which is not converted/,
    ],
    [
      'a key that is not PEFT’s',
      input({}, [vec('model.layers.0.self_attn.q_proj.lora_A.weight', [4, 64])]),
      /is not a PEFT LoRA tensor/,
    ],
    ['a rank other than r', input({ r: 8 }), /has rank 4, but adapter_config\.json says r = 8/],
    ['no tensors at all', input({}, [], []), /holds no LoRA tensors/],
  ] as const)('%s', (_, bad, reason) => {
    expect(refusal(bad)).toMatch(reason);
  });

  it('an adapter missing a half', () => {
    const st = writeSafetensors([vec('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight', [64, 4])]);
    expect(refusal({ config: loraConfig(), safetensors: st, base: llamaBase })).toMatch(
      /the LoRA for blk\.0\.attn_q\.weight has only its B half/,
    );
  });

  it('a base llama.cpp adapters are not made for here, or a Gemma lm_head (tied to the embeddings)', () => {
    expect(refusal({ ...input(), base: { ...llamaBase, architecture: 'falcon' } })).toMatch(
      /adapters for falcon models are not converted/,
    );
    const head = randomPairs(7, 4, [['lm_head', 64, 32000]]);
    expect(refusal({ ...input({}, [], head), base: { ...llamaBase, architecture: 'gemma2' } })).toMatch(
      /lm_head, which gemma2 models tie to the embeddings/,
    );
  });

  it('q/k rows that do not split into the base’s heads', () => {
    expect(refusal({ ...input(), base: { ...llamaBase, headCount: 5 } })).toMatch(
      /64 output rows, not a multiple of 2 × 5 heads/,
    );
  });

  it('an unreadable safetensors file, as a conversion error', () => {
    const cut = safetensorsOf(pairs).subarray(0, 200);
    expect(refusal({ config: loraConfig(), safetensors: cut, base: llamaBase })).toMatch(
      /adapter_model\.safetensors is not readable: .*truncated/,
    );
  });

  it('a name megabytes long, shown cut short', () => {
    const long = `base_model.model.${'x'.repeat(1 << 20)}.lora_A.weight`;
    const message = refusal(input({}, [vec(long, [4, 64])]));
    expect(message).toMatch(/^base_model\.model\.x+… adapts x+…, which is not converted/);
    expect(message.length).toBeLessThan(600);
  });

  it('accepts the empty patterns and nulls PEFT writes by default', () => {
    expect(() =>
      peftToGguf(input({ alpha_pattern: {}, rank_pattern: {}, modules_to_save: null, layer_replication: null })),
    ).not.toThrow();
  });
});

describe('the safetensors reader', () => {
  /** A file by hand: the header's JSON as given, then `data` bytes. */
  const raw = (header: unknown, dataBytes: number) => {
    const json = Buffer.from(JSON.stringify(header));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    return Buffer.concat([len, json, Buffer.alloc(dataBytes)]);
  };
  const err = (file: Buffer) => {
    try {
      readSafetensors(file);
    } catch (e) {
      expect(e).toBeInstanceOf(SafetensorsError);
      return (e as Error).message;
    }
    throw new Error('read, but a refusal was expected');
  };

  it('reads a file laid out by the format, with metadata, F32, F16 and BF16', () => {
    // 1.0 in each encoding: F32 0x3f800000, F16 0x3c00, BF16 0x3f80.
    const file = raw(
      {
        __metadata__: { format: 'pt' },
        a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] },
        h: { dtype: 'F16', shape: [1, 1], data_offsets: [4, 6] },
        b: { dtype: 'BF16', shape: [1], data_offsets: [6, 8] },
      },
      8,
    );
    const dataAt = file.length - 8;
    file.writeFloatLE(1, dataAt);
    file.writeUInt16LE(0x3c00, dataAt + 4);
    file.writeUInt16LE(0x3f80, dataAt + 6);
    const st = readSafetensors(file);
    expect(st.metadata).toEqual({ format: 'pt' });
    expect([...st.tensors.keys()]).toEqual(['a', 'h', 'b']);
    for (const t of st.tensors.values()) expect([...toFloat32(t)]).toEqual([1]);
    expect(st.tensors.get('h')?.shape).toEqual([1, 1]);
  });

  it('round-trips what it writes, F16 rounded to the nearest half', () => {
    const data = Float32Array.from([0, 1, -2.5, 65504, 1e-7, 0.1]);
    const st = readSafetensors(
      writeSafetensors([
        { name: 'f', dtype: 'F32', shape: [2, 3], data },
        { name: 'h', dtype: 'F16', shape: [6], data },
      ]),
    );
    expect(toFloat32(st.tensors.get('f')!)).toEqual(data);
    const h = toFloat32(st.tensors.get('h')!);
    expect([...h.subarray(0, 4)]).toEqual([0, 1, -2.5, 65504]);
    expect(h[4]).toBeCloseTo(1.1920928955078125e-7, 12); // the nearest subnormal half
    expect(h[5]).toBe(0.0999755859375);
  });

  it.each([
    ['a file shorter than the length field', Buffer.alloc(5), /too short/],
    [
      'a header length past 100 MiB',
      (() => {
        const b = Buffer.alloc(16);
        b.writeBigUInt64LE(2n ** 40n);
        return b;
      })(),
      /at most 104857600/,
    ],
    [
      'a header length past the end of the file',
      (() => {
        const b = Buffer.alloc(16);
        b.writeBigUInt64LE(100n);
        return b;
      })(),
      /claims 100 bytes but the file is 16/,
    ],
    [
      'a header that is not JSON',
      (() => {
        const b = Buffer.concat([Buffer.alloc(8), Buffer.from('{nope')]);
        b.writeBigUInt64LE(5n);
        return b;
      })(),
      /not JSON/,
    ],
    ['a header that is a list', raw([1, 2], 0), /not a JSON object/],
    ['an unknown dtype', raw({ t: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }, 8), /"I64"; only F32, F16/],
    ['a negative dimension', raw({ t: { dtype: 'F32', shape: [-1], data_offsets: [0, 4] } }, 4), /shape \[-1\]/],
    [
      'offsets past the data',
      raw({ t: { dtype: 'F32', shape: [4], data_offsets: [0, 16] } }, 8),
      /ends at byte 16 of the data, which is only 8/,
    ],
    ['offsets backwards', raw({ t: { dtype: 'F32', shape: [0], data_offsets: [8, 0] } }, 8), /not \[begin, end\]/],
    [
      'a shape that does not fill its span',
      raw({ t: { dtype: 'F16', shape: [3], data_offsets: [0, 8] } }, 8),
      /needs 6 bytes, but spans 8/,
    ],
    [
      'a shape whose size overflows',
      raw({ t: { dtype: 'F32', shape: [2 ** 40, 2 ** 40], data_offsets: [0, 8] } }, 8),
      /but spans 8/,
    ],
    [
      'tensors sharing bytes',
      raw(
        {
          x: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
          y: { dtype: 'F32', shape: [2], data_offsets: [4, 12] },
        },
        12,
      ),
      /x and y overlap/,
    ],
    ['metadata that is not strings', raw({ __metadata__: { n: 1 } }, 0), /__metadata__\.n is not a string/],
  ] as const)('refuses %s', (_, file, reason) => {
    expect(err(file)).toMatch(reason);
  });
});

// --- in real llama.cpp ------------------------------------------------------------------------------------------

// The hidden rope permutation, written from torch's reshape: GGUF row k of a q/k weight is HF row from[k], with
// rows viewed as [h, 2, n/2h] and the last two axes swapped. llama's converter applies it to the base q/k weights.
function hfRowOf(rows: number, h: number): number[] {
  const perHead = rows / h;
  const half = perHead / 2;
  return Array.from({ length: rows }, (_, k) => {
    const head = Math.floor(k / perHead);
    const j = Math.floor((k % perHead) / 2);
    const t = k % 2;
    return head * perHead + t * half + j;
  });
}

/** (alpha/r)·B·A in GGUF layout (row-major [out, in]), rows reordered as llama's converter would for q/k. */
function mergedDelta(p: PeftPair, scale: number): Float32Array {
  const bc = new Float32Array(p.outDim * p.inDim);
  for (let o = 0; o < p.outDim; o++)
    for (let i = 0; i < p.inDim; i++) {
      let s = 0;
      for (let k = 0; k < p.r; k++) s += p.b[o * p.r + k]! * p.a[k * p.inDim + i]!;
      bc[o * p.inDim + i] = scale * s;
    }
  if (p.embedding) {
    // An embedding's delta is [embd, vocab]; the table is stored [vocab, embd].
    const t = new Float32Array(bc.length);
    for (let e = 0; e < p.outDim; e++) for (let v = 0; v < p.inDim; v++) t[v * p.outDim + e] = bc[e * p.inDim + v]!;
    return t;
  }
  const kind = /self_attn\.([qk])_proj$/.exec(p.module)?.[1];
  if (!kind) return bc;
  const from = hfRowOf(p.outDim, kind === 'q' ? TINY_LLAMA.heads : TINY_LLAMA.kvHeads);
  const out = new Float32Array(bc.length);
  for (let k = 0; k < p.outDim; k++) out.set(bc.subarray(from[k]! * p.inDim, (from[k]! + 1) * p.inDim), k * p.inDim);
  return out;
}

function ggufTarget(module: string): string {
  if (module === 'lm_head') return 'output.weight';
  if (module === 'model.embed_tokens') return 'token_embd.weight';
  const names: Record<string, string> = {
    q_proj: 'attn_q',
    k_proj: 'attn_k',
    v_proj: 'attn_v',
    o_proj: 'attn_output',
    gate_proj: 'ffn_gate',
    up_proj: 'ffn_up',
    down_proj: 'ffn_down',
  };
  const m = /^model\.layers\.(\d+)\.\w+\.(\w+)$/.exec(module)!;
  return `blk.${m[1]}.${names[m[2]!]}.weight`;
}

/** The same adapter with q/k B rows pre-shuffled so the converter's reordering cancels out: what forgetting it gives. */
function withoutPermutation(pairs: PeftPair[]): PeftPair[] {
  return pairs.map((p) => {
    const kind = /self_attn\.([qk])_proj$/.exec(p.module)?.[1];
    if (!kind) return p;
    const from = hfRowOf(p.outDim, kind === 'q' ? TINY_LLAMA.heads : TINY_LLAMA.kvHeads);
    const b = new Float32Array(p.b.length);
    for (let k = 0; k < p.outDim; k++) b.set(p.b.subarray(k * p.r, (k + 1) * p.r), from[k]! * p.r);
    return { ...p, b };
  });
}

describe('in llama.cpp, on the tiny llama', () => {
  let llama: Llama;
  let base: LlamaModel;
  let dir: string;
  let prompt: Token[];
  let plain: Float32Array[];

  const write = async (name: string, body: Buffer) => {
    const file = path.join(dir, name);
    await fs.writeFile(file, body);
    return file;
  };

  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-lora-'));
    llama = await cpuLlama();
    base = await llama.loadModel({ modelPath: await write('base.gguf', tinyLlama()) });
    prompt = promptTokens(base);
    plain = await logitsAt(base, prompt);
  });
  afterAll(async () => {
    await base?.dispose();
    await llama?.dispose();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('loads an adapter on all seven projections of both layers: scale 1 changes the output, scale 0 does not', async () => {
    const adapter = await write('all7.gguf', convert(randomPairs(11, 4, tinyLinears())));
    const one = await logitsAt(base, prompt, [{ filePath: adapter, scale: 1 }]);
    const zero = await logitsAt(base, prompt, [{ filePath: adapter, scale: 0 }]);
    const moved = maxDiff(plain, one);
    console.info(`all seven projections: logits move by up to ${moved.toFixed(4)} at scale 1`);
    expect(moved).toBeGreaterThan(0.05);
    expect(maxDiff(plain, zero)).toBeLessThan(1e-5);
    // And what greedy decoding says, the operator's view of "the adapter does something".
    expect(await greedy(base, prompt, 16, [{ filePath: adapter, scale: 1 }])).not.toEqual(
      await greedy(base, prompt, 16),
    );
  });

  it('gives what the base with (alpha/r)·B·A merged in gives: right orientation, q/k rows reordered', async () => {
    const { embd, vocab } = TINY_LLAMA;
    const r = 4;
    const alpha = 8;
    const pairs = [
      ...randomPairs(12, r, tinyLinears()),
      ...randomPairs(13, r, [['lm_head', embd, vocab]]),
      ...randomPairs(14, r, [['model.embed_tokens', vocab, embd]]).map((p) => ({ ...p, embedding: true })),
    ];
    const deltas = new Map(pairs.map((p) => [ggufTarget(p.module), mergedDelta(p, alpha / r)]));
    const merged = await llama.loadModel({
      modelPath: await write(
        'merged.gguf',
        tinyLlama({
          edit: (name, _ne, data) => {
            const d = deltas.get(name);
            if (d) for (let i = 0; i < data.length; i++) data[i]! += d[i]!;
          },
        }),
      ),
    });
    try {
      const expected = await logitsAt(merged, prompt);
      const config = { r, lora_alpha: alpha };
      const f32 = await write('f32.gguf', convert(pairs, { config }));
      const f16 = await write('f16.gguf', convert(pairs, { config, dtype: 'F16' }));
      const unpermuted = await write('unpermuted.gguf', convert(withoutPermutation(pairs), { config }));

      const viaF32 = maxDiff(expected, await logitsAt(base, prompt, [{ filePath: f32 }]));
      const viaF16 = maxDiff(expected, await logitsAt(base, prompt, [{ filePath: f16 }]));
      const wrong = maxDiff(expected, await logitsAt(base, prompt, [{ filePath: unpermuted }]));
      const moved = maxDiff(expected, plain);
      console.info(
        `merged vs adapter, max logit difference: F32 ${viaF32.toExponential(2)}, F16 ${viaF16.toExponential(2)}; without the q/k reordering ${wrong.toExponential(2)}; no adapter ${moved.toExponential(2)}`,
      );
      expect(moved).toBeGreaterThan(0.1);
      expect(viaF32).toBeLessThan(1e-3);
      expect(viaF16).toBeLessThan(1e-2);
      // The control: forgetting the reordering is measurably wrong, so the checks above can tell.
      expect(wrong).toBeGreaterThan(20 * Math.max(viaF32, viaF16));
      expect(await greedy(base, prompt, 16, [{ filePath: f32 }])).toEqual(await greedy(merged, prompt, 16));
    } finally {
      await merged.dispose();
    }
  });
});
