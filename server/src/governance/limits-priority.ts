// Batch tokens (ApiToken.batch) are for work nobody waits on: a nightly evaluation, an embedding backfill. Their
// requests go behind interactive ones for a model's replicas: one is sent only while some READY replica of the
// model has no interactive request of this server in flight or waiting, else it waits (bounded) for one to end.
// An asleep model with nobody waiting is woken by a batch request as by any other. Interactive requests never wait
// for batch ones. Under budget pressure they are refused first too (limits-enforcer.ts keeps them off the last
// tenth of every budget).

export type BatchWait = { ok: true } | { ok: false; waitedMs: number; interactive: number };

export class PriorityGate {
  /** Interactive requests of this process in flight or waiting, by model. */
  private readonly interactive = new Map<string, number>();
  private readonly waiters = new Map<string, Set<() => void>>();

  /** Counts an interactive request until the returned function is called (once, when it ends). */
  interactiveStarted(model: string): () => void {
    this.interactive.set(model, (this.interactive.get(model) ?? 0) + 1);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const left = (this.interactive.get(model) ?? 1) - 1;
      if (left > 0) this.interactive.set(model, left);
      else this.interactive.delete(model);
      for (const wake of this.waiters.get(model) ?? []) wake();
    };
  }

  interactiveNow(model: string): number {
    return this.interactive.get(model) ?? 0;
  }

  /**
   * Resolves when a batch request for `model` may go: at once when a replica is free of interactive work, else
   * when one becomes so; refused after `waitMs` (HANGAR_GATEWAY_WAKE_SECONDS) or when the client leaves.
   */
  async batchTurn(
    model: string,
    readyReplicas: () => number,
    waitMs: number,
    signal?: AbortSignal,
  ): Promise<BatchWait> {
    const free = () => this.interactiveNow(model) < Math.max(1, readyReplicas());
    if (free()) return { ok: true };
    const started = Date.now();
    let set = this.waiters.get(model);
    if (!set) {
      set = new Set();
      this.waiters.set(model, set);
    }
    const waiters = set;
    try {
      for (;;) {
        const left = started + waitMs - Date.now();
        if (left <= 0 || signal?.aborted)
          return { ok: false, waitedMs: Date.now() - started, interactive: this.interactiveNow(model) };
        await new Promise<void>((resolve) => {
          const timer = setTimeout(done, Math.min(left, 1000));
          function done() {
            clearTimeout(timer);
            waiters.delete(done);
            signal?.removeEventListener('abort', done);
            resolve();
          }
          waiters.add(done);
          signal?.addEventListener('abort', done, { once: true });
        });
        if (free()) return { ok: true };
      }
    } finally {
      if (!waiters.size) this.waiters.delete(model);
    }
  }
}
