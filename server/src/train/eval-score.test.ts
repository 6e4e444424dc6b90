import { describe, expect, it } from 'vitest';
import {
  type AnsweredQuestion,
  evaluate,
  exactMatch,
  MIN_QUESTIONS,
  pairedBootstrap,
  rougeL,
  tokenF1,
  words,
} from './eval-score.js';
import { heldOutCount, heldOutLines, MIN_HELD_OUT, pairsAtLines } from './eval-split.js';

// The pure parts of a job's evaluation: how an answer is scored against its reference, how base and adapter are
// compared question by question, and which pairs are held out. The node's side (real llama.cpp) is in
// test/train-eval.test.ts.

describe('scores of one answer', () => {
  it("normalises as SQuAD does: case, punctuation and articles don't count", () => {
    expect(words('The Answer, is: 42!')).toEqual(['answer', 'is', '42']);
    expect(exactMatch('the Paris.', 'Paris')).toBe(true);
    expect(exactMatch('Paris, France', 'Paris')).toBe(false);
  });

  it('token F1 counts shared words, each as often as the reference has it', () => {
    expect(tokenF1('Paris', 'Paris')).toBe(1);
    expect(tokenF1('Lyon', 'Paris')).toBe(0);
    // 1 shared of 2 answered (precision 1/2) and of 1 expected (recall 1): F1 2/3.
    expect(tokenF1('Paris France', 'Paris')).toBeCloseTo(2 / 3);
    expect(tokenF1('yes yes yes', 'yes no')).toBeCloseTo((2 * (1 / 3) * (1 / 2)) / (1 / 3 + 1 / 2));
  });

  it('ROUGE-L rewards words in the right order', () => {
    expect(rougeL('one two three', 'one two three')).toBe(1);
    expect(rougeL('three two one', 'one two three')).toBeCloseTo(1 / 3);
    expect(rougeL('one three', 'one two three')).toBeCloseTo((2 * 1 * (2 / 3)) / (1 + 2 / 3));
  });
});

const q = (i: number, o: Partial<AnsweredQuestion> = {}): AnsweredQuestion => ({
  set: 'pairs',
  question: `q${i}`,
  reference: `answer ${i}`,
  baseAnswer: `wrong ${i}`,
  adapterAnswer: `wrong ${i}`,
  baseLogLikelihood: -5,
  adapterLogLikelihood: -5,
  ...o,
});

describe('the paired comparison and its verdict', () => {
  it('moves when one answer changes', () => {
    const answers = Array.from({ length: 10 }, (_, i) => q(i));
    const before = evaluate(answers, 1).metrics.find((m) => m.set === 'pairs' && m.name === 'tokenF1');
    answers[3] = q(3, { adapterAnswer: 'answer 3' });
    const after = evaluate(answers, 1).metrics.find((m) => m.set === 'pairs' && m.name === 'tokenF1');
    // "wrong 3" against "answer 3": one word of two shared, F1 0.5 on every question.
    expect(before?.adapter).toBeCloseTo(0.5);
    expect(after?.adapter).toBeGreaterThan(before?.adapter ?? 1);
    expect(after?.difference).toBeCloseTo(0.05);
  });

  it('is BETTER when the adapter answers clearly better, WORSE when clearly worse, with the interval', () => {
    const better = Array.from({ length: 20 }, (_, i) =>
      q(i, { adapterAnswer: `answer ${i}`, adapterLogLikelihood: -1 }),
    );
    const e = evaluate(better, 7);
    expect(e.verdict).toBe('BETTER');
    const f1 = e.metrics.find((m) => m.name === 'tokenF1' && m.set === 'pairs');
    expect(f1?.low).toBeGreaterThan(0);
    expect(f1?.low).toBeLessThanOrEqual(f1?.difference ?? 0);

    const worse = Array.from({ length: 20 }, (_, i) => q(i, { baseAnswer: `answer ${i}`, adapterLogLikelihood: -9 }));
    expect(evaluate(worse, 7).verdict).toBe('WORSE');
  });

  it('says NO_CLEAR_DIFFERENCE when differences go both ways, and INSUFFICIENT_DATA with too few questions', () => {
    const mixed = Array.from({ length: 20 }, (_, i) =>
      q(i, i % 2 ? { adapterAnswer: `answer ${i}` } : { baseAnswer: `answer ${i}` }),
    );
    expect(evaluate(mixed, 3).verdict).toBe('NO_CLEAR_DIFFERENCE');
    const few = Array.from({ length: MIN_QUESTIONS - 1 }, (_, i) => q(i, { adapterAnswer: `answer ${i}` }));
    expect(evaluate(few, 3).verdict).toBe('INSUFFICIENT_DATA');
    // No general questions answered: forgetting cannot be judged.
    expect(evaluate(few, 3).forgettingVerdict).toBe('INSUFFICIENT_DATA');
  });

  it('judges the general questions apart from the pairs (forgetting)', () => {
    const answers = [
      ...Array.from({ length: 10 }, (_, i) => q(i, { adapterAnswer: `answer ${i}` })),
      ...Array.from({ length: 10 }, (_, i) =>
        q(i, { set: 'general', baseAnswer: `answer ${i}`, adapterLogLikelihood: -8 }),
      ),
    ];
    const e = evaluate(answers, 5);
    expect(e.verdict).toBe('BETTER');
    expect(e.forgettingVerdict).toBe('WORSE');
  });

  it('calls a sure but tiny shift NO_CLEAR_DIFFERENCE', () => {
    // Every question 0.01 nats per token more likely with the adapter: the interval is tight, the change nothing.
    const tiny = Array.from({ length: 40 }, (_, i) => q(i, { adapterLogLikelihood: -4.99 }));
    const e = evaluate(tiny, 2);
    expect(e.metrics.find((m) => m.set === 'pairs' && m.name === 'logLikelihood')?.low).toBeGreaterThan(0);
    expect(e.verdict).toBe('NO_CLEAR_DIFFERENCE');
  });

  it('gives the same interval for the same seed', () => {
    const b = [0.1, 0.5, 0.2, 0.9, 0.4, 0.3];
    const a = [0.2, 0.4, 0.6, 0.8, 0.5, 0.3];
    expect(pairedBootstrap(b, a, 11)).toEqual(pairedBootstrap(b, a, 11));
  });
});

describe('the held-out pairs', () => {
  const data = Array.from({ length: 100 }, (_, i) => JSON.stringify({ q: `q${i}`, a: `a${i}` })).join('\n');

  it('holds out the share asked for, at least a handful, never more than half', () => {
    expect(heldOutCount(100, 0.1)).toBe(10);
    expect(heldOutCount(20, 0.1)).toBe(MIN_HELD_OUT);
    expect(heldOutCount(6, 0.1)).toBe(3);
    expect(heldOutCount(100, 0)).toBe(0);
  });

  it('picks the same pairs for the same seed, others for another', () => {
    const a = heldOutLines(data, 0.1, 42);
    expect(a).toHaveLength(10);
    expect(heldOutLines(data, 0.1, 42)).toEqual(a);
    expect(heldOutLines(data, 0.1, 43)).not.toEqual(a);
    expect(pairsAtLines(data, a).map((p) => p.q)).toEqual(a.map((l) => `q${l - 1}`));
  });

  it('holds out every line that asks a held-out question, so none of them is trained on', () => {
    // Each question twice: picking one holds out its twin too, and it is evaluated once.
    const twice = Array.from({ length: 40 }, (_, i) => JSON.stringify({ q: `q${i % 20}`, a: `a${i % 20}` })).join('\n');
    const lines = heldOutLines(twice, 0.1, 1);
    expect(lines).toHaveLength(2 * MIN_HELD_OUT);
    const held = pairsAtLines(twice, lines);
    expect(held).toHaveLength(MIN_HELD_OUT);
    for (const p of held) expect(lines).toContain(Number(p.q.slice(1)) + 1 + 20);
  });
});
