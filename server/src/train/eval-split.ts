import { pairsOf } from './data.js';

// Which pairs a job sets aside to judge its adapter. Chosen by a seed that is recorded on the job, so the same job
// always holds out the same questions: an evaluation that changed its test set between runs could not be compared.

/** The share held out when a job does not say (evalShare). */
export const DEFAULT_EVAL_SHARE = 0.1;
/**
 * At least this many questions are held out (when the pairs allow it): a verdict from two or three questions is
 * noise, and fewer than this many gives INSUFFICIENT_DATA anyway.
 */
export const MIN_HELD_OUT = 5;
/**
 * At most this many: each is answered twice (base, adapter) on the node after training, and a few hundred already
 * give a narrow interval.
 */
export const MAX_HELD_OUT = 200;

/** mulberry32: small, seeded, the same numbers on every platform. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

/**
 * How many of `pairs` are held out for `share`: the share rounded up, at least MIN_HELD_OUT, at most MAX_HELD_OUT,
 * and never more than half the pairs (the adapter must still have something to learn from). 0 when share is 0.
 */
export function heldOutCount(pairs: number, share: number): number {
  if (share <= 0 || pairs < 2) return 0;
  const wanted = Math.max(Math.ceil(pairs * share), MIN_HELD_OUT);
  return Math.min(wanted, MAX_HELD_OUT, Math.floor(pairs / 2));
}

/**
 * The line numbers (as checkTrainData counts them, from 1) of the pairs held out, in order. Questions are picked
 * among distinct questions, and every line asking a picked question is held out with it: a question repeated in
 * the training pairs would otherwise be "held out" and learnt by heart at once.
 */
export function heldOutLines(data: string, share: number, seed: number): number[] {
  const byQuestion = new Map<string, number[]>();
  for (const p of pairsOf(data)) {
    if ('error' in p) continue;
    const same = byQuestion.get(p.q);
    if (same) same.push(p.line);
    else byQuestion.set(p.q, [p.line]);
  }
  const lines = [...byQuestion.values()].map((ls) => ls[0] as number);
  const n = heldOutCount(lines.length, share);
  // A seeded Fisher–Yates over the pairs' lines; the first n are held out.
  const next = seeded(seed);
  const order = [...lines];
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [order[i], order[j]] = [order[j] as number, order[i] as number];
  }
  const firsts = new Map([...byQuestion.values()].map((ls) => [ls[0] as number, ls]));
  return order
    .slice(0, n)
    .flatMap((l) => firsts.get(l) ?? [l])
    .sort((a, b) => a - b);
}

/** The held-out pairs themselves, by line (or every pair of an evaluation file), for the node's evaluation. */
export function pairsAtLines(data: string, lines: number[] | 'all'): { q: string; a: string }[] {
  const wanted = lines === 'all' ? null : new Set(lines);
  const out: { q: string; a: string }[] = [];
  const asked = new Set<string>();
  for (const p of pairsOf(data)) {
    if ('error' in p || (wanted && !wanted.has(p.line)) || asked.has(p.q)) continue;
    asked.add(p.q);
    out.push({ q: p.q, a: p.a });
  }
  return out;
}
