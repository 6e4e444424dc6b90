// How Hangar waits: between tries at something that is away (the database, the Hub, the control plane), for a
// moment, and until work in flight has drained at shutdown. One formula and one sleep for the server and the
// node agent alike, so a change to how Hangar backs off or stops reaches every loop, not the one somebody
// remembered.

export type Backoff = {
  /** The wait at attempt 0; each attempt after doubles it. */
  baseMs: number;
  /** The longest wait, however many attempts failed. */
  maxMs: number;
  /**
   * The share of the wait (0 to 1) drawn at random: 0.5 waits between half and all of it. Many clients that lost
   * the same server at once then come back spread out, rather than all at the same instant. 0 (the default)
   * waits exactly.
   */
  jitter?: number;
  /** Stands in for Math.random in tests. */
  random?: () => number;
};

/**
 * The wait before a try, doubling from `baseMs` at attempt 0 up to `maxMs`, then `jitter` of it drawn at random
 * (after the cap, so the cap's waits spread too). A negative attempt counts as 0.
 */
export function backoffMs(attempt: number, o: Backoff): number {
  // The exponent stops where 2 ** n is still finite: a loop that failed for a week must not reach Infinity × 0.
  const capped = Math.min(o.maxMs, o.baseMs * 2 ** Math.min(Math.max(0, attempt), 1000));
  const jitter = o.jitter ?? 0;
  if (jitter <= 0) return capped;
  return capped * (1 - jitter + jitter * (o.random ?? Math.random)());
}

/** Waits `ms`; an abort ends the wait at once, and then it rejects with the signal's reason. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Polls `done` every `pollMs` until it holds or `timeoutMs` has passed, and says whether it holds at the end: a
 * shutdown waits for requests, transfers or a process to drain, but never for good.
 */
export async function waitUntil(done: () => boolean, o: { timeoutMs: number; pollMs: number }): Promise<boolean> {
  const deadline = Date.now() + o.timeoutMs;
  while (!done() && Date.now() < deadline) await sleep(o.pollMs);
  return done();
}

/** Retry-After as seconds or an HTTP date, in milliseconds from now; null when absent or unreadable. */
export function retryAfterMs(value: string | null, now = Date.now()): number | null {
  if (!value) return null;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}
