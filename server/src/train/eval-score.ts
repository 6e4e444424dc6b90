import { seeded } from './eval-split.js';

// Scores a job's evaluation: the base and the base with the adapter answered the same questions on the node
// (greedy, same seed); here each answer is compared with the reference and the two models are compared question
// by question. A bare mean would call a lucky difference on six questions an improvement, so each difference
// comes with a bootstrap interval over the questions, and the verdict says when the evidence is not enough.

export type EvalVerdict = 'BETTER' | 'WORSE' | 'NO_CLEAR_DIFFERENCE' | 'INSUFFICIENT_DATA';
/** The job's own held-out pairs, or the general questions shipped with Hangar (to catch forgetting). */
export type EvalSet = 'pairs' | 'general';

/** What the node reports for one question. Log-likelihoods are per token of the reference answer (natural log). */
export type AnsweredQuestion = {
  set: EvalSet;
  question: string;
  reference: string;
  baseAnswer: string;
  adapterAnswer: string;
  baseLogLikelihood: number;
  adapterLogLikelihood: number;
};

export type ScoredQuestion = AnsweredQuestion & {
  baseF1: number;
  adapterF1: number;
  baseExact: boolean;
  adapterExact: boolean;
  baseRougeL: number;
  adapterRougeL: number;
};

export type EvalMetric = {
  set: EvalSet;
  name: 'tokenF1' | 'exactMatch' | 'rougeL' | 'logLikelihood' | 'perplexity';
  base: number;
  adapter: number;
  /** adapter − base. */
  difference: number;
  /** The 95 % bootstrap interval of the difference. */
  low: number;
  high: number;
};

export type Evaluation = {
  verdict: EvalVerdict;
  forgettingVerdict: EvalVerdict;
  metrics: EvalMetric[];
  questions: ScoredQuestion[];
};

/** Fewer questions than this in a set gives INSUFFICIENT_DATA: no interval from so few means anything. */
export const MIN_QUESTIONS = 5;
const RESAMPLES = 2000;

// ─── per answer ──────────────────────────────────────────────────────────────

/** SQuAD's normalisation: lower case, no punctuation, no articles, single spaces; then the words. */
export function words(text: string): string[] {
  return text
    .toLowerCase()
    .normalize('NFKC')
    .replace(/[\p{P}\p{S}]/gu, ' ')
    .split(/\s+/)
    .filter((w) => w && w !== 'a' && w !== 'an' && w !== 'the');
}

/** Token-level F1 of an answer against the reference (SQuAD's): the harmonic mean of word precision and recall. */
export function tokenF1(answer: string, reference: string): number {
  const a = words(answer);
  const r = words(reference);
  if (a.length === 0 || r.length === 0) return a.length === r.length ? 1 : 0;
  const counts = new Map<string, number>();
  for (const w of r) counts.set(w, (counts.get(w) ?? 0) + 1);
  let common = 0;
  for (const w of a) {
    const c = counts.get(w) ?? 0;
    if (c > 0) {
      common++;
      counts.set(w, c - 1);
    }
  }
  if (common === 0) return 0;
  const precision = common / a.length;
  const recall = common / r.length;
  return (2 * precision * recall) / (precision + recall);
}

export function exactMatch(answer: string, reference: string): boolean {
  return words(answer).join(' ') === words(reference).join(' ');
}

/** ROUGE-L F1: the longest common subsequence of words, as a share of each side, combined. */
export function rougeL(answer: string, reference: string): number {
  const a = words(answer);
  const r = words(reference);
  if (a.length === 0 || r.length === 0) return a.length === r.length ? 1 : 0;
  let prev = new Array<number>(r.length + 1).fill(0);
  for (const x of a) {
    const row = new Array<number>(r.length + 1).fill(0);
    for (let j = 1; j <= r.length; j++)
      row[j] = x === r[j - 1] ? (prev[j - 1] as number) + 1 : Math.max(prev[j] as number, row[j - 1] as number);
    prev = row;
  }
  const lcs = prev[r.length] as number;
  if (lcs === 0) return 0;
  const p = lcs / a.length;
  const rc = lcs / r.length;
  return (2 * p * rc) / (p + rc);
}

export function scoreQuestion(q: AnsweredQuestion): ScoredQuestion {
  return {
    ...q,
    baseF1: tokenF1(q.baseAnswer, q.reference),
    adapterF1: tokenF1(q.adapterAnswer, q.reference),
    baseExact: exactMatch(q.baseAnswer, q.reference),
    adapterExact: exactMatch(q.adapterAnswer, q.reference),
    baseRougeL: rougeL(q.baseAnswer, q.reference),
    adapterRougeL: rougeL(q.adapterAnswer, q.reference),
  };
}

// ─── paired comparison ───────────────────────────────────────────────────────

const mean = (xs: number[]) => (xs.length ? xs.reduce((s, x) => s + x, 0) / xs.length : 0);

/**
 * The statistic's difference (adapter − base) and its 95 % percentile bootstrap interval, resampling whole
 * questions (so each question's base and adapter scores stay paired). Seeded: the same answers give the same
 * interval every time.
 */
export function pairedBootstrap(
  base: number[],
  adapter: number[],
  seed: number,
  stat: (xs: number[]) => number = mean,
): { base: number; adapter: number; difference: number; low: number; high: number } {
  const n = base.length;
  const b = stat(base);
  const a = stat(adapter);
  if (n === 0) return { base: b, adapter: a, difference: 0, low: 0, high: 0 };
  const next = seeded(seed);
  const diffs: number[] = [];
  const rb = new Array<number>(n);
  const ra = new Array<number>(n);
  for (let k = 0; k < RESAMPLES; k++) {
    for (let i = 0; i < n; i++) {
      const j = Math.floor(next() * n);
      rb[i] = base[j] as number;
      ra[i] = adapter[j] as number;
    }
    diffs.push(stat(ra) - stat(rb));
  }
  diffs.sort((x, y) => x - y);
  const at = (p: number) => diffs[Math.min(diffs.length - 1, Math.max(0, Math.floor(p * diffs.length)))] as number;
  return { base: b, adapter: a, difference: a - b, low: at(0.025), high: at(0.975) };
}

function metricsOf(set: EvalSet, qs: ScoredQuestion[], seed: number): EvalMetric[] {
  const pick = (f: (q: ScoredQuestion) => number, g: (q: ScoredQuestion) => number) => [qs.map(f), qs.map(g)] as const;
  const perplexity = (lls: number[]) => Math.exp(-mean(lls));
  const rows: [EvalMetric['name'], readonly [number[], number[]], ((xs: number[]) => number) | undefined][] = [
    [
      'tokenF1',
      pick(
        (q) => q.baseF1,
        (q) => q.adapterF1,
      ),
      undefined,
    ],
    [
      'exactMatch',
      pick(
        (q) => Number(q.baseExact),
        (q) => Number(q.adapterExact),
      ),
      undefined,
    ],
    [
      'rougeL',
      pick(
        (q) => q.baseRougeL,
        (q) => q.adapterRougeL,
      ),
      undefined,
    ],
    [
      'logLikelihood',
      pick(
        (q) => q.baseLogLikelihood,
        (q) => q.adapterLogLikelihood,
      ),
      undefined,
    ],
    [
      'perplexity',
      pick(
        (q) => q.baseLogLikelihood,
        (q) => q.adapterLogLikelihood,
      ),
      perplexity,
    ],
  ];
  return rows.map(([name, [b, a], stat], i) => ({ set, name, ...pairedBootstrap(b, a, seed + i, stat) }));
}

/**
 * The smallest difference that counts, per measure: a change of 0.02 in token F1 or of 0.05 nats per token in the
 * reference's log-likelihood is one nobody would notice in the answers, however sure the interval is of it (a
 * near-identical adapter on many questions gives a tight interval around a meaningless shift).
 */
export const SMALLEST_DIFFERENCE: Record<string, number> = { tokenF1: 0.02, logLikelihood: 0.05 };

/**
 * The verdict for one set, from the two measures that see every question: token F1 of the greedy answers, and
 * the log-likelihood of the reference answers. WORSE when either is clearly lower (its interval wholly below 0, by
 * more than SMALLEST_DIFFERENCE), BETTER when neither is and one is clearly higher, NO_CLEAR_DIFFERENCE otherwise;
 * INSUFFICIENT_DATA below MIN_QUESTIONS questions.
 */
export function verdictOf(questions: number, metrics: EvalMetric[]): EvalVerdict {
  if (questions < MIN_QUESTIONS) return 'INSUFFICIENT_DATA';
  const decisive = metrics.filter((m) => m.name === 'tokenF1' || m.name === 'logLikelihood');
  const margin = (m: EvalMetric) => SMALLEST_DIFFERENCE[m.name] ?? 0;
  if (decisive.some((m) => m.high < 0 && m.difference < -margin(m))) return 'WORSE';
  if (decisive.some((m) => m.low > 0 && m.difference > margin(m))) return 'BETTER';
  return 'NO_CLEAR_DIFFERENCE';
}

/** Scores every answer and compares the two models, for the pairs and the general questions apart. */
export function evaluate(answers: AnsweredQuestion[], seed: number): Evaluation {
  const questions = answers.map(scoreQuestion);
  const pairs = questions.filter((q) => q.set === 'pairs');
  const general = questions.filter((q) => q.set === 'general');
  const pairMetrics = metricsOf('pairs', pairs, seed);
  const generalMetrics = metricsOf('general', general, seed + 100);
  return {
    verdict: verdictOf(pairs.length, pairMetrics),
    forgettingVerdict: verdictOf(general.length, generalMetrics),
    metrics: [...pairMetrics, ...generalMetrics],
    questions,
  };
}

/** One line for a refusal or the CLI: "token F1 0.41 → 0.22 (−0.19, 95 % CI −0.30 to −0.08)". */
export function describeMetric(m: Pick<EvalMetric, 'name' | 'base' | 'adapter' | 'difference' | 'low' | 'high'>) {
  const label: Record<string, string> = {
    tokenF1: 'token F1',
    exactMatch: 'exact match',
    rougeL: 'ROUGE-L',
    logLikelihood: 'log-likelihood per token of the reference',
    perplexity: 'perplexity of the reference',
  };
  const f = (x: number) => (Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(3));
  const sign = (x: number) => (x >= 0 ? `+${f(x)}` : f(x));
  return `${label[m.name] ?? m.name} ${f(m.base)} → ${f(m.adapter)} (${sign(m.difference)}, 95 % CI ${sign(m.low)} to ${sign(m.high)})`;
}
