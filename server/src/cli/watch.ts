// Following a long job from a terminal. The work lives in the server (a download of hours does not depend on
// this terminal), so Ctrl-C only stops the watching: it says so, and how to watch again, and exits 130.

export type Followed = 'finished' | 'interrupted';

export type FollowOptions<T> = {
  /** The state the command already has; when it has ended, nothing is subscribed. */
  first: T;
  /** The subscription's events. */
  events: AsyncGenerator<T>;
  /**
   * The state as it is now. A subscription sends changes only, and one that happened between starting the work
   * and subscribing would be missed: so it is read once the stream is opening, and every `everyMs` after.
   */
  current: () => Promise<T | null>;
  /** Shows an event; true when the job has ended and watching is over. */
  show: (value: T) => boolean;
  /** Printed on Ctrl-C, after "stopped watching": what goes on, and the command that watches it again. */
  onInterrupt: () => void;
  everyMs?: number;
  signal?: NodeJS.Process;
};

export async function follow<T>(o: FollowOptions<T>): Promise<Followed> {
  if (o.show(o.first)) {
    await o.events.return(undefined);
    return 'finished';
  }
  const proc = o.signal ?? process;
  let onSigint: () => void = () => {};
  const interrupted = new Promise<'interrupted'>((resolve) => {
    onSigint = () => resolve('interrupted');
    proc.on('SIGINT', onSigint);
  });
  let timer: NodeJS.Timeout | undefined;
  let ended = false;
  let settle: (v: 'finished') => void = () => {};
  const finished = new Promise<'finished'>((resolve) => {
    settle = resolve;
  });
  const take = (value: T | null) => {
    if (ended || value == null) return;
    if (o.show(value)) {
      ended = true;
      settle('finished');
    }
  };
  const poll = async () => {
    try {
      take(await o.current());
    } catch {
      // A missed read is made up by the next one or by the stream; the stream's own failure ends the watch.
    }
    if (!ended) timer = setTimeout(poll, o.everyMs ?? 5000);
  };
  const stream = (async () => {
    for await (const e of o.events) {
      take(e);
      if (ended) break;
    }
    return 'finished' as const;
  })();
  timer = setTimeout(poll, 250);
  try {
    const outcome = await Promise.race([finished, interrupted, stream]);
    if (outcome === 'interrupted') o.onInterrupt();
    return outcome;
  } finally {
    ended = true;
    clearTimeout(timer);
    proc.off('SIGINT', onSigint);
  }
}
