import { describe, expect, it } from 'vitest';
import { describeEvaluation } from './train-show.js';

// `hangar train show` as a person reads it: the verdicts, each measure with its interval, the answers side by side.

const job = {
  id: '0c9a7d3e-0000-4000-8000-000000000001',
  name: 'support-tone',
  model: 'tiny',
  state: 'DONE',
  step: 7,
  steps: 7,
  loss: 0.4,
  message: 'trained',
  heldOut: 5,
  adapter: null,
} as const;

describe('hangar train show', () => {
  it('prints the verdicts, the measures with their intervals, and both answers to each question', () => {
    const text = describeEvaluation({
      ...job,
      evaluation: {
        heldOut: 5,
        seed: 42,
        verdict: 'WORSE',
        forgettingVerdict: 'NO_CLEAR_DIFFERENCE',
        metrics: [{ set: 'pairs', name: 'tokenF1', base: 0.6, adapter: 0.2, difference: -0.4, low: -0.6, high: -0.2 }],
        questions: [
          {
            set: 'pairs',
            question: 'Which floor is room 3 on?',
            reference: 'Floor 3.',
            baseAnswer: 'Floor 3',
            adapterAnswer: 'Banana',
          },
        ],
      },
    } as never);
    expect(text).toContain('held-out pairs (5, seed 42): WORSE');
    expect(text).toContain('general questions (forgetting): NO_CLEAR_DIFFERENCE');
    expect(text).toMatch(/pairs\s+tokenF1\s+0\.600\s+0\.200\s+-0\.400\s+-0\.600 to -0\.200/);
    expect(text).toMatch(/Which floor is room 3 on\?\s+Floor 3\.\s+Floor 3\s+Banana/);
  });

  it('says when a job has not been evaluated yet, and how many pairs it holds out', () => {
    expect(describeEvaluation({ ...job, state: 'RUNNING', evaluation: null } as never)).toContain(
      '5 pairs held out; the adapter is evaluated against its base after training',
    );
  });
});
