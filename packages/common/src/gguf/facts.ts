import { fileTypeName, tensorBytes } from './catalog.js';
import type { GgufHeader, GgufValue } from './reader.js';

/** What a GGUF header says about the model, in the terms the memory estimate and the operator need. */
export type ModelFacts = {
  architecture: string | null;
  name: string | null;
  /** general.type: "model", "adapter", … (absent in older files). */
  type: string | null;
  contextLength: number | null;
  layers: number | null;
  embeddingLength: number | null;
  heads: number | null;
  kvHeads: number | null;
  keyLength: number | null;
  valueLength: number | null;
  /** Per-layer KV widths (n_embd_k_gqa + n_embd_v_gqa), when the header gives per-layer head counts. */
  kvWidthPerLayer: number[] | null;
  fileType: string | null;
  parameterCount: number;
  tensorBytes: number;
  tensorCount: number;
  splitCount: number | null;
  splitIndex: number | null;
};

const num = (v: GgufValue | undefined): number | null =>
  typeof v === 'number' ? v : typeof v === 'bigint' ? Number(v) : null;

/** A per-layer value (an array) or one value for every layer. */
const perLayer = (v: GgufValue | undefined, layers: number): number[] | null => {
  if (Array.isArray(v)) return v.map((x) => num(x) ?? 0);
  const n = num(v);
  return n === null ? null : Array.from({ length: layers }, () => n);
};

export function factsOf(h: GgufHeader): ModelFacts {
  const m = h.metadata;
  const str = (k: string) => (typeof m.get(k) === 'string' ? (m.get(k) as string) : null);
  const arch = str('general.architecture');
  const a = (k: string) => (arch ? m.get(`${arch}.${k}`) : undefined);
  const layers = num(a('block_count'));
  const embd = num(a('embedding_length'));
  const headsPer = layers ? perLayer(a('attention.head_count'), layers) : null;
  const kvPer = layers ? (perLayer(a('attention.head_count_kv'), layers) ?? headsPer) : null;
  const heads = headsPer ? Math.max(...headsPer) : null;
  const kvHeads = kvPer ? Math.max(...kvPer) : null;
  const keyLength = num(a('attention.key_length')) ?? (embd && heads ? embd / heads : null);
  const valueLength = num(a('attention.value_length')) ?? (embd && heads ? embd / heads : null);
  const kvWidthPerLayer =
    kvPer && keyLength !== null && valueLength !== null ? kvPer.map((n) => n * keyLength + n * valueLength) : null;
  let parameterCount = 0;
  let bytes = 0;
  for (const t of h.tensors) {
    const elements = t.dims.reduce((p, d) => p * d, 1);
    parameterCount += elements;
    bytes += tensorBytes(t.type, elements);
  }
  const ft = num(m.get('general.file_type'));
  return {
    architecture: arch,
    name: str('general.name'),
    type: str('general.type'),
    contextLength: num(a('context_length')),
    layers,
    embeddingLength: embd,
    heads,
    kvHeads,
    keyLength,
    valueLength,
    kvWidthPerLayer,
    fileType: ft === null ? null : (fileTypeName(ft) ?? `file type ${ft}`),
    parameterCount,
    tensorBytes: bytes,
    tensorCount: h.tensors.length,
    splitCount: num(m.get('split.count')),
    splitIndex: num(m.get('split.no')),
  };
}
