import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { backoffMs, retryAfterMs, sleep, waitUntil } from './retry.js';

describe('backoffMs', () => {
  it('doubles from baseMs at attempt 0 and stops at maxMs', () => {
    const waits = [0, 1, 2, 3, 4, 5, 6].map((n) => backoffMs(n, { baseMs: 250, maxMs: 5000 }));
    expect(waits).toEqual([250, 500, 1000, 2000, 4000, 5000, 5000]);
  });

  it('counts a negative attempt as 0', () => {
    expect(backoffMs(-1, { baseMs: 500, maxMs: 10_000 })).toBe(500);
  });

  it('stays at the cap, never Infinity or NaN, however many attempts failed', () => {
    expect(backoffMs(10_000, { baseMs: 250, maxMs: 5000 })).toBe(5000);
    expect(backoffMs(10_000, { baseMs: 0, maxMs: 5000 })).toBe(0);
  });

  it('draws the jitter share of the capped wait at random', () => {
    const o = { baseMs: 1000, maxMs: 30_000, jitter: 0.5 };
    expect(backoffMs(10, { ...o, random: () => 0 })).toBe(15_000);
    expect(backoffMs(10, { ...o, random: () => 0.5 })).toBe(22_500);
    expect(backoffMs(1, { ...o, random: () => 0.999 })).toBeCloseTo(1999, 0);
    for (let i = 0; i < 100; i++) {
      const w = backoffMs(2, o);
      expect(w).toBeGreaterThanOrEqual(2000);
      expect(w).toBeLessThan(4000);
    }
  });

  // Each call site it replaced, with that site's numbers: the waits are what they were.
  it("gives each former formula's waits", () => {
    for (let n = 1; n <= 12; n++) {
      // db/outage.ts and pubsub.ts
      expect(backoffMs(n, { baseMs: 250, maxMs: 5000 })).toBe(Math.min(5000, 250 * 2 ** Math.min(n, 10)));
      // db/embedded.ts
      expect(backoffMs(n - 1, { baseMs: 1000, maxMs: 10_000 })).toBe(Math.min(10_000, 1000 * 2 ** (n - 1)));
      // the downloads' backoff(first, cap)(n)
      expect(backoffMs(n - 1, { baseMs: 500, maxMs: 60_000 })).toBe(Math.min(60_000, 500 * 2 ** Math.max(0, n - 1)));
      // the agent's progress reports
      expect(backoffMs(n, { baseMs: 2000, maxMs: 30_000 })).toBe(Math.min(2000 * 2 ** n, 30_000));
      // the agent's training-work socket (graphql-ws's retries count from 0)
      const r = 0.37;
      expect(backoffMs(n - 1, { baseMs: 3000, maxMs: 30_000, jitter: 0.5, random: () => r })).toBeCloseTo(
        Math.min(30_000, (30_000 / 10) * 2 ** (n - 1)) * (0.5 + r / 2),
        9,
      );
    }
  });
});

// On vitest's fake timers: each wait is what the timers say, not what a busy machine's clock happened to show.
describe('sleep', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('waits the time asked, and not less', async () => {
    let done = false;
    const waiting = sleep(30).then(() => {
      done = true;
    });
    await vi.advanceTimersByTimeAsync(29);
    expect(done).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    await waiting;
    expect(done).toBe(true);
  });

  it('ends at once on an abort, rejecting with its reason', async () => {
    const ac = new AbortController();
    const waiting = sleep(10_000, ac.signal);
    const rejected = expect(waiting).rejects.toThrow('stopping');
    await vi.advanceTimersByTimeAsync(10);
    ac.abort(new Error('stopping'));
    await rejected;
    expect(vi.getTimerCount()).toBe(0);
  });

  it('rejects at once when already aborted', async () => {
    await expect(sleep(10_000, AbortSignal.abort(new Error('gone')))).rejects.toThrow('gone');
  });
});

describe('waitUntil', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('returns true as soon as the condition holds, one poll after another', async () => {
    let n = 0;
    const waiting = waitUntil(() => ++n >= 3, { timeoutMs: 5000, pollMs: 5 });
    await vi.advanceTimersByTimeAsync(10);
    expect(await waiting).toBe(true);
    expect(n).toBeGreaterThanOrEqual(3);
  });

  it('gives up at the timeout, saying the condition does not hold', async () => {
    let settled = false;
    const waiting = waitUntil(() => false, { timeoutMs: 40, pollMs: 10 }).finally(() => {
      settled = true;
    });
    await vi.advanceTimersByTimeAsync(30);
    expect(settled).toBe(false);
    await vi.advanceTimersByTimeAsync(20);
    expect(await waiting).toBe(false);
  });

  it('does not wait at all when it already holds', async () => {
    expect(await waitUntil(() => true, { timeoutMs: 0, pollMs: 1000 })).toBe(true);
  });
});

describe('retryAfterMs', () => {
  it('reads seconds and HTTP dates', () => {
    expect(retryAfterMs('7')).toBe(7000);
    expect(retryAfterMs(new Date(70_000).toUTCString(), 10_000)).toBe(60_000);
    expect(retryAfterMs(null)).toBeNull();
    expect(retryAfterMs('later')).toBeNull();
  });
});
