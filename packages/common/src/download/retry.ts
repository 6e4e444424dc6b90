// The waits between tries that every download in Hangar shares (resumable.ts, and the agent's small requests
// beside its downloads): one formula and one sleep, so a change to how Hangar backs off reaches all of them.

/** Doubling from `firstMs` at the first retry, never over `capMs`: the wait before retry `n` (1, 2, …). */
export function backoff(firstMs: number, capMs: number): (n: number) => number {
  return (n) => Math.min(capMs, firstMs * 2 ** Math.max(0, n - 1));
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

/** Retry-After as seconds or an HTTP date, in milliseconds from now; null when absent or unreadable. */
export function retryAfterMs(value: string | null, now = Date.now()): number | null {
  if (!value) return null;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}
