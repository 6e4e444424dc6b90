import { z } from 'zod';

// What one limit may say, by kind: the rules the API (setLimit) and hangar.yaml's `limits:` section share. In its
// own file so that both read it without importing each other.

const MAX = 1_000_000_000_000; // a trillion: more than any budget, less than 2^53
const count = (what: string) =>
  z
    .number()
    .int(`${what} is a whole number`)
    .min(0, `${what} is at least 0 (0 refuses every request)`)
    .max(MAX, `${what} is at most ${MAX}`)
    .nullish();

export const limitInput = z
  .object({
    requestsPerMinute: count('requests per minute'),
    tokensPerMinute: count('tokens per minute'),
    concurrentRequests: count('requests at once'),
    tokensPerDay: count('tokens per day'),
    tokensPerMonth: count('tokens per month'),
    spendPerMonth: z
      .number()
      .min(0, 'spend per month is at least 0')
      .max(1e9, 'spend per month is at most 1000000000')
      .refine(
        (v) => Math.abs(Math.round(v * 100) - v * 100) < 1e-6,
        'spend per month is money: at most 2 decimals (cents)',
      )
      .nullish(),
  })
  .strict();
