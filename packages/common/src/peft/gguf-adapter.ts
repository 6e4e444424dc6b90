import { DTYPE_BYTES, readSafetensors, type SafeTensor, SafetensorsError, shown, toFloat32 } from './safetensors.js';

// Makes llama.cpp's LoRA adapter GGUF from a PEFT adapter (adapter_config.json + adapter_model.safetensors), as
// llama.cpp's convert_lora_to_gguf.py does, so a node serving the base GGUF can load the adapter with --lora.
// What llama.cpp would silently get wrong (a missing rope permutation, DoRA, per-module ranks) is refused here with
// the reason, because a wrong adapter still loads: it just answers worse, and nobody would know why.

export class AdapterConversionError extends Error {
  override name = 'AdapterConversionError';
}

export type AdapterBase = {
  /** The base GGUF's general.architecture: the adapter must carry the same, or llama.cpp refuses it. */
  architecture: string;
  headCount: number;
  headCountKv: number;
};

export type PeftToGgufInput = {
  /** The parsed adapter_config.json. */
  config: unknown;
  /** adapter_model.safetensors; the caller bounds its size. */
  safetensors: Buffer;
  base: AdapterBase;
};

// llama's HF→GGUF converter reorders the rows of q_proj/k_proj within each head (HF rotates half-split pairs,
// llama.cpp adjacent pairs); an adapter's lora_b must get the same reordering or it adds to the wrong rows.
const ROPE_PERMUTED = new Set(['llama', 'mistral3']);
// Same PEFT names, weights converted unpermuted. Gemma's converter drops lm_head (tied to the embeddings).
const UNPERMUTED = new Set(['qwen2', 'qwen3', 'qwen3moe', 'phi3', 'gemma', 'gemma2', 'gemma3']);
const NO_OUTPUT = new Set(['gemma', 'gemma2', 'gemma3']);

/** PEFT module under model.layers.N → llama.cpp tensor under blk.N, in the order a layer's tensors are written. */
const LAYER_MODULES = new Map(
  Object.entries({
    'self_attn.q_proj': 'attn_q',
    'self_attn.k_proj': 'attn_k',
    'self_attn.v_proj': 'attn_v',
    'self_attn.o_proj': 'attn_output',
    'mlp.gate_proj': 'ffn_gate',
    'mlp.up_proj': 'ffn_up',
    'mlp.down_proj': 'ffn_down',
  }),
);
const SUPPORTED =
  'q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head and embed_tokens (lora_embedding)';

const GGML_TYPE: Record<'F32' | 'F16', number> = { F32: 0, F16: 1 };
const ALIGN = 32;
const pad = (n: number) => Math.ceil(n / ALIGN) * ALIGN;

type Pair = {
  /** The base tensor the pair adapts, e.g. blk.0.attn_q.weight. */
  target: string;
  embedding: boolean;
  a?: SafeTensor;
  b?: SafeTensor;
  /** Sort key (token_embd, then layers in order, output last): the same adapter gives the same bytes. */
  order: number;
};

type OutTensor = { name: string; ne: number[]; type: 'F32' | 'F16'; data: Buffer };

/**
 * The GGUF adapter's bytes. Throws AdapterConversionError saying why an adapter cannot be converted faithfully,
 * so the job can fail with a reason the operator can act on (retrain without DoRA, one rank for all modules, …).
 */
export function peftToGguf(input: PeftToGgufInput): Buffer {
  const { base } = input;
  const config = readConfig(input.config);
  const permuted = ropePermuted(base);
  let file: ReturnType<typeof readSafetensors>;
  try {
    file = readSafetensors(input.safetensors);
  } catch (err) {
    if (err instanceof SafetensorsError)
      throw new AdapterConversionError(`adapter_model.safetensors is not readable: ${err.message}`);
    throw err;
  }
  const pairs = pairUp(file.tensors.values(), base.architecture);
  if (pairs.length === 0) throw new AdapterConversionError('adapter_model.safetensors holds no LoRA tensors');
  // Names stay far under llama.cpp's 64-byte limit: layer numbers have at most 5 digits (targetOf).
  return writeGguf(
    base.architecture,
    config.alpha,
    pairs.flatMap((p) => convertPair(p, config.r, permuted ? base : null)),
  );
}

/** Whether the base's q/k rows were reordered by llama's converter; refuses a base it cannot say for. */
function ropePermuted(base: AdapterBase): boolean {
  const permuted = ROPE_PERMUTED.has(base.architecture);
  if (!permuted && !UNPERMUTED.has(base.architecture))
    throw new AdapterConversionError(
      `adapters for ${base.architecture} models are not converted: whether llama.cpp reorders its q/k rows is not known here (supported: ${[...ROPE_PERMUTED, ...UNPERMUTED].join(', ')})`,
    );
  if (permuted)
    for (const [what, h] of [
      ['headCount', base.headCount],
      ['headCountKv', base.headCountKv],
    ] as const)
      if (!Number.isSafeInteger(h) || h <= 0)
        throw new AdapterConversionError(`the base's ${what} is ${h}: a positive head count is needed`);
  return permuted;
}

/** One PEFT pair as llama.cpp's lora_a and lora_b: PEFT's bytes as they are, but for the two reorderings. */
function convertPair(p: Pair, r: number, permuteFor: AdapterBase | null): OutTensor[] {
  const { a, b } = p;
  if (!a || !b)
    throw new AdapterConversionError(
      `the LoRA for ${p.target} has only its ${a ? 'A' : 'B'} half: the adapter is incomplete (llama.cpp needs both)`,
    );
  if (a.shape.length !== 2 || b.shape.length !== 2)
    throw new AdapterConversionError(
      `the LoRA for ${p.target} has A ${JSON.stringify(a.shape)} and B ${JSON.stringify(b.shape)}: both must be 2-D`,
    );
  const [rankA, inner] = a.shape as [number, number];
  const [outer, rankB] = b.shape as [number, number];
  // llama.cpp scales by alpha / (B's rank); PEFT by alpha / r. They agree only while every module has rank r.
  if (rankA !== r || rankB !== r)
    throw new AdapterConversionError(
      `the LoRA for ${p.target} has rank ${rankA === r ? rankB : rankA}, but adapter_config.json says r = ${r}: llama.cpp scales every module by one alpha/r`,
    );

  // One type for the pair: F32 and F16 are kept as they are; BF16, or A and B of different types, become F32
  // (as llama.cpp's converter does), since widening loses nothing.
  const type: 'F32' | 'F16' = a.dtype === b.dtype && a.dtype !== 'BF16' ? a.dtype : 'F32';
  let aData = asType(a, type);
  let bData = asType(b, type);
  const elem = DTYPE_BYTES[type];

  // GGUF lists dimensions innermost first: torch's A [r, in] is ne [in, r], B [out, r] is ne [r, out].
  let aNe = [inner, rankA];
  if (p.embedding) {
    // llama.cpp picks rows of A by token id (get_rows), so it wants PEFT's [r, vocab] A as [vocab, r].
    aData = transpose(aData, rankA, inner, elem);
    aNe = [rankA, inner];
  }
  const kind = p.target.split('.')[2];
  if (permuteFor && (kind === 'attn_q' || kind === 'attn_k')) {
    const h = kind === 'attn_q' ? permuteFor.headCount : permuteFor.headCountKv;
    if (outer % (2 * h) !== 0)
      throw new AdapterConversionError(
        `the LoRA for ${p.target} has ${outer} output rows, not a multiple of 2 × ${h} heads: it does not fit this base`,
      );
    bData = permuteRows(bData, outer, rankB * elem, h);
  }
  return [
    { name: `${p.target}.lora_a`, ne: aNe, type, data: aData },
    { name: `${p.target}.lora_b`, ne: [rankB, outer], type, data: bData },
  ];
}

type LoraConfig = { r: number; alpha: number };

const nonEmpty = (v: unknown) =>
  v !== undefined &&
  v !== null &&
  (Array.isArray(v) ? v.length > 0 : typeof v === 'object' && Object.keys(v).length > 0);

/** The parts of PEFT's LoraConfig that decide the conversion; refuses what llama.cpp cannot express. */
function readConfig(raw: unknown): LoraConfig {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw))
    throw new AdapterConversionError('adapter_config.json is not a JSON object');
  const c = raw as Record<string, unknown>;
  if (c.peft_type !== undefined && c.peft_type !== 'LORA')
    throw new AdapterConversionError(
      `adapter_config.json says peft_type ${JSON.stringify(c.peft_type)}: only LORA adapters convert to llama.cpp`,
    );
  if (c.use_dora === true)
    throw new AdapterConversionError(
      'the adapter is DoRA (use_dora): llama.cpp has no magnitude vectors, so it would run as a different model; train with use_dora false',
    );
  if (nonEmpty(c.alpha_pattern) || nonEmpty(c.rank_pattern))
    throw new AdapterConversionError(
      'the adapter sets alpha_pattern or rank_pattern: llama.cpp applies one alpha/r to every module; train with one rank and alpha',
    );
  if (c.fan_in_fan_out === true)
    throw new AdapterConversionError(
      'the adapter has fan_in_fan_out (Conv1D-style transposed weights), which llama.cpp models do not use',
    );
  if (nonEmpty(c.modules_to_save))
    throw new AdapterConversionError(
      `the adapter saves whole modules (modules_to_save ${JSON.stringify(c.modules_to_save)}): a LoRA GGUF holds only low-rank pairs`,
    );
  if (c.bias !== undefined && c.bias !== null && c.bias !== 'none')
    throw new AdapterConversionError(
      `the adapter trains biases (bias ${JSON.stringify(c.bias)}): a LoRA GGUF holds no biases; train with bias "none"`,
    );
  if (c.lora_bias === true)
    throw new AdapterConversionError('the adapter has lora_bias: a LoRA GGUF holds no biases; train without it');
  if (nonEmpty(c.layer_replication))
    throw new AdapterConversionError(
      'the adapter uses layer_replication, which changes the model llama.cpp would load',
    );
  const r = c.r;
  if (typeof r !== 'number' || !Number.isSafeInteger(r) || r <= 0)
    throw new AdapterConversionError(`adapter_config.json has r ${JSON.stringify(r)}: a positive whole rank is needed`);
  const alpha = c.lora_alpha;
  if (typeof alpha !== 'number' || !Number.isFinite(alpha) || alpha <= 0)
    throw new AdapterConversionError(
      `adapter_config.json has lora_alpha ${JSON.stringify(alpha)}: a positive number is needed (0 would mean "unscaled" to llama.cpp)`,
    );
  // Converted rather than refused: rsLoRA scales by alpha/√r, llama.cpp by alpha/r, so writing alpha·√r gives
  // llama.cpp exactly rsLoRA's scale (alpha·√r / r = alpha/√r). llama.cpp's own converter ignores the flag.
  return { r, alpha: c.use_rslora === true ? alpha * Math.sqrt(r) : alpha };
}

/** Groups the file's tensors into A/B pairs by the base tensor they adapt; refuses anything that is not one. */
function pairUp(tensors: Iterable<SafeTensor>, architecture: string): Pair[] {
  const pairs = new Map<string, Pair>();
  for (const t of tensors) {
    const key = t.name;
    if (key.includes('lora_magnitude_vector'))
      throw new AdapterConversionError(
        `${shown(key)} is a DoRA magnitude vector: llama.cpp cannot apply DoRA; train with use_dora false`,
      );
    if (key.includes('modules_to_save'))
      throw new AdapterConversionError(
        `${shown(key)} is a whole module saved with the adapter (modules_to_save): not a LoRA pair`,
      );
    // A copy of the base weight itself, which some tools save along: the base GGUF already has it.
    if (key.endsWith('.base_layer.weight')) continue;
    if (key.endsWith('.bias'))
      throw new AdapterConversionError(`${shown(key)} is a bias: a LoRA GGUF holds no biases; train with bias "none"`);
    const linear = /^base_model\.model\.(.+)\.lora_([AB])\.weight$/.exec(key);
    const embedding = /^base_model\.model\.(.+)\.lora_embedding_([AB])$/.exec(key);
    const m = linear ?? embedding;
    if (!m) {
      if (key.endsWith('.weight') && !/\.lora_[AB]\.weight$/.test(key))
        throw new AdapterConversionError(
          `${shown(key)} is a full weight, not a LoRA pair (modules_to_save?): it cannot go in a LoRA GGUF`,
        );
      throw new AdapterConversionError(
        `${shown(key)} is not a PEFT LoRA tensor (base_model.model.<module>.lora_A/B.weight)`,
      );
    }
    const [, module, half] = m as unknown as [string, string, 'A' | 'B'];
    const target = targetOf(module, embedding !== null);
    if (!target)
      throw new AdapterConversionError(
        `${shown(key)} adapts ${shown(module)}${embedding ? ' (as an embedding)' : ''}, which is not converted: supported are ${SUPPORTED}`,
      );
    if (target.name === 'output.weight' && NO_OUTPUT.has(architecture))
      throw new AdapterConversionError(
        `${shown(key)} adapts lm_head, which ${architecture} models tie to the embeddings: llama.cpp has no output.weight to adapt`,
      );
    const pair = pairs.get(target.name) ?? { target: target.name, embedding: embedding !== null, order: target.order };
    pair[half === 'A' ? 'a' : 'b'] = t;
    pairs.set(target.name, pair);
  }
  return [...pairs.values()].sort((x, y) => x.order - y.order);
}

const MODULE_ORDER = [...LAYER_MODULES.values()];

function targetOf(module: string, embedding: boolean): { name: string; order: number } | null {
  if (embedding) return module === 'model.embed_tokens' ? { name: 'token_embd.weight', order: -1 } : null;
  // A base with tied embeddings has no output.weight in its GGUF; llama.cpp then refuses the adapter by name.
  if (module === 'lm_head') return { name: 'output.weight', order: Number.MAX_SAFE_INTEGER };
  const m = /^model\.layers\.(0|[1-9]\d{0,4})\.(self_attn\.\w+|mlp\.\w+)$/.exec(module);
  const kind = m && LAYER_MODULES.get(m[2]!);
  if (!m || !kind) return null;
  const layer = Number(m[1]);
  return { name: `blk.${layer}.${kind}.weight`, order: layer * 100 + MODULE_ORDER.indexOf(kind) };
}

function asType(t: SafeTensor, type: 'F32' | 'F16'): Buffer {
  if (t.dtype === type) return t.data;
  const f = toFloat32(t);
  return Buffer.from(f.buffer, f.byteOffset, f.byteLength);
}

/** A row-major [rows, cols] matrix of `elem`-byte values as [cols, rows]. */
function transpose(data: Buffer, rows: number, cols: number, elem: number): Buffer {
  // Typed arrays over aligned copies: an embedding's A is vocab × r values, too many to move a Buffer.copy each.
  const aligned = new Uint8Array(data);
  const from = elem === 4 ? new Uint32Array(aligned.buffer) : new Uint16Array(aligned.buffer);
  const to = elem === 4 ? new Uint32Array(from.length) : new Uint16Array(from.length);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) to[j * rows + i] = from[i * cols + j]!;
  return Buffer.from(to.buffer);
}

/**
 * llama's q/k row order: within each of h heads, the rows of the first and second halves interleave. Row
 * (head, t, j) of PEFT's [h, 2, n/2h] layout moves to (head, j, t) — torch's reshape(h, 2, n/h/2, r).swapaxes(1, 2).
 */
function permuteRows(data: Buffer, rows: number, rowBytes: number, h: number): Buffer {
  const perHead = rows / h;
  const half = perHead / 2;
  const out = Buffer.alloc(data.length);
  for (let head = 0; head < h; head++)
    for (let j = 0; j < half; j++)
      for (let t = 0; t < 2; t++) {
        const from = head * perHead + t * half + j;
        const to = head * perHead + j * 2 + t;
        data.copy(out, to * rowBytes, from * rowBytes, (from + 1) * rowBytes);
      }
  return out;
}

/** GGUF v3 as llama.cpp reads it (§2 of the reference): data at PAD(header, 32), each tensor at Σ PAD(nbytes, 32). */
function writeGguf(architecture: string, alpha: number, tensors: OutTensor[]): Buffer {
  const parts: Buffer[] = [];
  const u32 = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(n);
    parts.push(b);
  };
  const u64 = (n: number) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(n));
    parts.push(b);
  };
  const str = (s: string) => {
    const b = Buffer.from(s, 'utf8');
    u64(b.length);
    parts.push(b);
  };
  const GGUF_U32 = 4;
  const GGUF_F32 = 6;
  const GGUF_STRING = 8;
  const kvs: [string, number, () => void][] = [
    ['general.architecture', GGUF_STRING, () => str(architecture)],
    ['general.type', GGUF_STRING, () => str('adapter')],
    ['adapter.type', GGUF_STRING, () => str('lora')],
    [
      'adapter.lora.alpha',
      GGUF_F32,
      () => {
        const b = Buffer.alloc(4);
        b.writeFloatLE(alpha);
        parts.push(b);
      },
    ],
    ['general.quantization_version', GGUF_U32, () => u32(2)],
  ];

  parts.push(Buffer.from('GGUF', 'latin1'));
  u32(3);
  u64(tensors.length);
  u64(kvs.length);
  for (const [key, type, value] of kvs) {
    str(key);
    u32(type);
    value();
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    str(t.name);
    u32(t.ne.length);
    for (const d of t.ne) u64(d);
    u32(GGML_TYPE[t.type]);
    u64(offset);
    offsets.push(offset);
    offset += pad(t.data.length);
  }
  const header = Buffer.concat(parts);
  const dataStart = pad(header.length);
  const out = Buffer.alloc(dataStart + offset);
  header.copy(out, 0);
  for (const [i, t] of tensors.entries()) t.data.copy(out, dataStart + offsets[i]!);
  return out;
}
