// Whether the client of a /v1 request went away, and what to stop when it does: the request to the replica in
// flight. An AbortController would say the same, but its AbortSignal (an EventTarget) costs 3–5 µs of CPU to make
// and listen to, on every request, against a bare Node proxy's whole ~120 µs (#33's profile): here it is a flag and
// one callback, and an AbortSignal is made only for what needs one (waiting for a model to start, a rare path).

export class Departure {
  aborted = false;
  reason: Error | undefined;
  private stop: ((reason: Error) => void) | undefined;
  private controller: AbortController | undefined;

  /** The client went away: the request in flight is stopped, and every later check sees `aborted`. */
  abort(reason: Error) {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.stop?.(reason);
    this.controller?.abort(reason);
  }

  /**
   * What to stop when the client goes away: the replica's request now in flight (one at a time: the next attempt's
   * replaces it). Called at once when the client is gone already.
   */
  onAbort(stop: (reason: Error) => void) {
    this.stop = stop;
    if (this.aborted) stop(this.reason as Error);
  }

  /** The same as an AbortSignal, for what takes one (sleep while a model starts): made on first use. */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }
}
