// The mirror's bandwidth limit (HANGAR_MIRROR_BANDWIDTH): one token bucket that every download in the process
// draws from, so three files at once share the limit instead of each taking it whole. A download takes its bytes
// before writing them; with the bucket empty it waits, its buffers fill, and the socket stops reading, so the
// upstream is slowed by TCP's own flow control rather than by dropped data.

/** Bytes a limited download hands over at a time: small enough that a slow limit still moves progress often. */
export const SLICE = 64 << 10;

export class Bandwidth {
  private tokens: number;
  private at = Date.now();

  constructor(private rate: number | null) {
    this.tokens = this.burst();
  }

  /** Bytes per second, or null for no limit. */
  get limit() {
    return this.rate;
  }

  /** A new limit takes effect for the next bytes taken. */
  setLimit(rate: number | null) {
    this.refill();
    this.rate = rate;
    this.tokens = Math.min(this.tokens, this.burst());
  }

  /** A quarter of a second's worth: enough to keep the disk busy, too little to let a burst beat the limit. */
  private burst() {
    return this.rate === null ? 0 : Math.max(SLICE, this.rate / 4);
  }

  private refill() {
    const now = Date.now();
    if (this.rate !== null) this.tokens = Math.min(this.burst(), this.tokens + ((now - this.at) / 1000) * this.rate);
    this.at = now;
  }

  /**
   * Waits until `bytes` may go. The bytes are owed at once (the bucket may go below zero), so callers that come
   * later wait behind those before them: fair in the order they asked.
   */
  async take(bytes: number, signal?: AbortSignal): Promise<void> {
    if (this.rate === null) return;
    this.refill();
    this.tokens -= bytes;
    if (this.tokens >= 0) return;
    const ms = (-this.tokens / this.rate) * 1000;
    await new Promise<void>((resolve) => {
      const t = setTimeout(done, ms);
      function done() {
        clearTimeout(t);
        signal?.removeEventListener('abort', done);
        resolve();
      }
      signal?.addEventListener('abort', done, { once: true });
    });
  }
}
