import { isUtf8 } from 'node:buffer';
import { createHash } from 'node:crypto';

// A job's pairs: NDJSON of {"q": …, "a": …}, optionally with the knowledge-base "collection" they came from.
// Checked in one pass, so the console can show the whole report before anyone submits, and createTrainJob can
// refuse the first bad line by its number.

/** A job's data at most: enough for hundreds of thousands of pairs, small enough to keep and re-send. */
export const TRAIN_MAX_DATA_BYTES = 64 * 1024 * 1024;

const SHOWN = 20;

export type LengthStats = { min: number; max: number; mean: number; p50: number; p95: number };

export type TrainDataReport = {
  pairs: number;
  bytes: number;
  sha256: string;
  /** Lines that are not a pair (not JSON, no q or a, an empty one), the first few. */
  errors: { line: number; message: string }[];
  errorCount: number;
  /** Pairs that repeat an earlier one (same q and a): the first few. */
  duplicates: { line: number; sameAs: number }[];
  duplicateCount: number;
  /** The knowledge-base collections the pairs come from (ids, in order of first appearance). */
  collections: string[];
  /** Lengths in characters. Token counts need the model's tokenizer, which the control plane does not load. */
  question: LengthStats | null;
  answer: LengthStats | null;
  /** Lengths in tokens, by the model's own tokenizer, when a model was named and its GGUF is in the mirror. */
  tokens: TokenStats | null;
  /** Why there are no token counts (no model named, not a GGUF here), when there are none. */
  tokensNote: string | null;
};

export type TokenStats = {
  /** The catalog model whose tokenizer counted. */
  model: string;
  question: LengthStats;
  answer: LengthStats;
  /** Question and answer together, as the trainer sees a pair (the chat template adds a few more). */
  pair: LengthStats;
  maxLen: number;
  /** Pairs longer than max_len tokens: the trainer cuts their answers short, or drops them. */
  overMaxLen: number;
};

export type TrainDataLine = { line: number; q: string; a: string; collection: string | null };

export function stats(values: number[]): LengthStats | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((x, y) => x - y);
  const at = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? 0;
  const sum = sorted.reduce((s, v) => s + v, 0);
  return {
    min: sorted[0] ?? 0,
    max: sorted.at(-1) ?? 0,
    mean: Math.round((sum / sorted.length) * 10) / 10,
    p50: at(0.5),
    p95: at(0.95),
  };
}

function parseLine(
  text: string,
): { ok: true; q: string; a: string; collection: string | null } | { ok: false; message: string } {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    return { ok: false, message: `not JSON (${(err as Error).message}); each line is {"q": "…", "a": "…"}` };
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    return { ok: false, message: 'not an object; each line is {"q": "…", "a": "…"}' };
  const o = v as Record<string, unknown>;
  if (typeof o.q !== 'string' || typeof o.a !== 'string')
    return { ok: false, message: 'needs "q" and "a", both strings' };
  if (o.q.trim() === '' || o.a.trim() === '')
    return { ok: false, message: `an empty ${o.q.trim() === '' ? 'q' : 'a'}` };
  if (o.collection != null && (typeof o.collection !== 'string' || o.collection.trim() === ''))
    return { ok: false, message: '"collection" is a collection id (a string) when present' };
  return { ok: true, q: o.q, a: o.a, collection: typeof o.collection === 'string' ? o.collection.trim() : null };
}

/** Every pair in the data, in order, with its line number; stops at nothing (the report says what was wrong). */
export function* pairsOf(data: string): Generator<TrainDataLine | { line: number; error: string }> {
  let line = 0;
  let start = 0;
  while (start <= data.length) {
    let end = data.indexOf('\n', start);
    if (end === -1) end = data.length;
    line++;
    const text = data.slice(start, end).trim();
    start = end + 1;
    if (text === '') {
      if (start > data.length) break;
      continue;
    }
    const p = parseLine(text);
    yield p.ok ? { line, q: p.q, a: p.a, collection: p.collection } : { line, error: p.message };
  }
}

export function checkTrainData(data: string): TrainDataReport {
  const bytes = Buffer.byteLength(data);
  const report: TrainDataReport = {
    pairs: 0,
    bytes,
    sha256: createHash('sha256').update(data).digest('hex'),
    errors: [],
    errorCount: 0,
    duplicates: [],
    duplicateCount: 0,
    collections: [],
    question: null,
    answer: null,
    tokens: null,
    tokensNote: 'name the model to count tokens with its tokenizer',
  };
  if (bytes > TRAIN_MAX_DATA_BYTES) {
    report.errors.push({ line: 0, message: `the data is ${bytes} bytes; at most ${TRAIN_MAX_DATA_BYTES} (64 MiB)` });
    report.errorCount = 1;
    return report;
  }
  const seen = new Map<string, number>();
  const collections = new Set<string>();
  const q: number[] = [];
  const a: number[] = [];
  for (const p of pairsOf(data)) {
    if ('error' in p) {
      report.errorCount++;
      if (report.errors.length < SHOWN) report.errors.push({ line: p.line, message: p.error });
      continue;
    }
    report.pairs++;
    q.push(p.q.length);
    a.push(p.a.length);
    if (p.collection) collections.add(p.collection);
    const key = createHash('sha1').update(p.q).update('\0').update(p.a).digest('base64');
    const first = seen.get(key);
    if (first !== undefined) {
      report.duplicateCount++;
      if (report.duplicates.length < SHOWN) report.duplicates.push({ line: p.line, sameAs: first });
    } else seen.set(key, p.line);
  }
  report.collections = [...collections];
  report.question = stats(q);
  report.answer = stats(a);
  return report;
}

/** Where the first byte that is not UTF-8 is: its line, its byte within that line (both from 1), its offset. */
export type Utf8Fault = { line: number; byte: number; offset: number };

/**
 * The first place `bytes` is not UTF-8 (WHATWG's rules: no overlong forms, no surrogates, nothing past U+10FFFF),
 * or null. Decoding such bytes would quietly put U+FFFD in their place, and the pairs trained on, and the sha256
 * answered, would then not be the file's.
 */
export function utf8Fault(bytes: Uint8Array): Utf8Fault | null {
  if (isUtf8(bytes)) return null;
  let i = 0;
  let line = 1;
  let lineStart = 0;
  const at = (offset: number): Utf8Fault => ({ line, byte: offset - lineStart + 1, offset });
  while (i < bytes.length) {
    const b = bytes[i] as number;
    if (b < 0x80) {
      if (b === 0x0a) {
        line++;
        lineStart = i + 1;
      }
      i++;
      continue;
    }
    // The lead byte says how many continuation bytes follow and which range the second may take.
    let need: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0;
      if (b === 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90;
      if (b === 0xf4) hi = 0x8f;
    } else return at(i);
    for (let k = 1; k <= need; k++) {
      const c = bytes[i + k];
      if (c === undefined || c < (k === 1 ? lo : 0x80) || c > (k === 1 ? hi : 0xbf)) return at(i);
    }
    i += need + 1;
  }
  return null;
}
