// A read that callers ask for at any moment (an event, a timer, a mutation of this process) but that should run
// one at a time: an ask while one runs makes exactly one more run after it, however many asks came, so a change
// made during a read is never missed and a burst of events costs two reads, not one per event.

/**
 * Wraps `run`: the returned function starts it, or, while it runs, marks one more run and answers the promise of
 * the whole sequence. `run` answers false to end the sequence early (a failed read: the database is away, and
 * asking again at once would fail the same; the next ask starts afresh).
 */
export function coalesced(run: () => Promise<unknown>): () => Promise<void> {
  let running: Promise<void> | undefined;
  let again = false;
  return () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        if ((await run()) === false) return;
      } while (again);
    })().finally(() => {
      running = undefined;
    });
    return running;
  };
}
