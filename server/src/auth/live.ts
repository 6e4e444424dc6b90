import type { Logger } from '@hangar/common/log';
import type { PubSub } from '../pubsub.js';
import type { AuthService, Credentials } from './auth.service.js';
import { credentialHolder, roleAtLeast, type Viewer, viewerRole } from './viewer.js';

// A subscription is authorized once, when it starts; it may then run for days. So whenever something changes
// what a holder may do (a token revoked, the user disabled or demoted, a session ended), every live connection
// of that holder asks again who it is, with the credentials it came with, and ends if the answer is weaker.
// Without this, a revoked token kept streaming every audit event and job to whoever had copied it.

export type LiveLimits = {
  /** Subscriptions one WebSocket connection may hold open at once. */
  perConnection: number;
  /** Subscriptions one caller (a user, over all their tokens and sessions, or a node) may hold in this process. */
  perCaller: number;
  /**
   * Live connections (WebSockets and SSE streams) one caller may hold in this process; unlimited when absent.
   * Without it one token holding a thousand idle WebSockets took every connection the server had.
   */
  connectionsPerCaller?: number;
};

/** A WebSocket that holds no subscription is closed this long after its last one ended (or it opened). */
export type IdleClose = { ms: number; onIdle: () => void };

/**
 * Why a connection ended, as a WebSocket close code and a reason: 4401 when its credentials no longer stand
 * (graphql-ws clients do not retry it), 4403 when they stand with a lower role (graphql-ws clients retry it,
 * and reconnecting gets the subscriptions the new role allows), 1013 when they could not be checked
 * (reconnecting checks them again).
 */
export type Ending = { code: 4401 | 4403 | 1013; message: string };

export type LiveCallersDeps = {
  auth: AuthService;
  pubsub: PubSub;
  log: Logger;
  limits: LiveLimits;
  /**
   * How often every live connection is checked again even without an event: a token that expires sends none,
   * and an event published while this replica's LISTEN connection was down is never heard.
   */
  recheckEveryMs?: number;
};

const RECHECK_EVERY_MS = 60_000;

/**
 * A connection is identified before it is listed, so a change that lands in between is heard by nobody. One
 * opened this soon after a change to its holder's credentials is checked again at once.
 */
const RECENT_CHANGE_MS = 10_000;

/** The live connections of this process, by holder, and how many subscriptions each holder has open. */
export class LiveCallers {
  private readonly byHolder = new Map<string, Set<LiveConnection>>();
  private readonly counts = new Map<string, number>();
  /** When each holder's credentials last changed, for RECENT_CHANGE_MS. */
  private readonly changedAt = new Map<string, number>();
  private stopListening: (() => void) | undefined;
  private sweep: NodeJS.Timeout | undefined;

  constructor(readonly deps: LiveCallersDeps) {}

  get limits(): LiveLimits {
    return this.deps.limits;
  }

  /** Listens for credentials changes (published through NOTIFY by every replica, in the changing transaction). */
  start(): void {
    const events = this.deps.pubsub.subscribe('credentials')[Symbol.asyncIterator]();
    this.stopListening = () => void events.return?.();
    void (async () => {
      for (;;) {
        const event = await events.next();
        if (event.done) return;
        const now = Date.now();
        this.changedAt.set(event.value, now);
        for (const [h, at] of this.changedAt) if (now - at > RECENT_CHANGE_MS) this.changedAt.delete(h);
        const connections = this.byHolder.get(event.value);
        if (connections) await Promise.all([...connections].map((c) => c.recheck({ failClosed: true })));
      }
    })().catch((err: unknown) =>
      this.deps.log.error('stopped checking live connections for credentials changes', { error: err }),
    );
    this.sweep = setInterval(() => {
      const all = [...this.byHolder.values()].flatMap((set) => [...set]);
      void Promise.all(all.map((c) => c.recheck({ failClosed: false })));
    }, this.deps.recheckEveryMs ?? RECHECK_EVERY_MS);
    this.sweep.unref();
  }

  stop(): void {
    this.stopListening?.();
    clearInterval(this.sweep);
  }

  /**
   * Why this caller may not open another live connection (its share, HANGAR_MAX_CONNECTIONS_PER_CALLER, is
   * held), or undefined. Checked and followed by open() in the same tick, so a burst cannot slip past it.
   */
  connectionRefusal(viewer: Viewer): string | undefined {
    const holder = credentialHolder(viewer);
    const most = this.deps.limits.connectionsPerCaller;
    const held = holder ? (this.byHolder.get(holder)?.size ?? 0) : 0;
    if (most === undefined || held < most) return undefined;
    // Short enough for a WebSocket close reason (123 bytes), where it is most often read.
    return `this caller holds ${held} live connections, its share (HANGAR_MAX_CONNECTIONS_PER_CALLER): close one to open another`;
  }

  /** A WebSocket connection, or the one subscription of an SSE request, for as long as it is open. */
  open(viewer: Viewer, credentials: Credentials, onEnd: (ending: Ending) => void, idle?: IdleClose): LiveConnection {
    const connection = new LiveConnection(this, viewer, credentials, onEnd, idle);
    const holder = connection.holder;
    if (holder) {
      const set = this.byHolder.get(holder) ?? new Set<LiveConnection>();
      set.add(connection);
      this.byHolder.set(holder, set);
      const changed = this.changedAt.get(holder);
      if (changed !== undefined && Date.now() - changed <= RECENT_CHANGE_MS)
        void connection.recheck({ failClosed: true });
    }
    return connection;
  }

  /** How many subscriptions a holder has open in this process. */
  subscriptionsOf(holder: string): number {
    return this.counts.get(holder) ?? 0;
  }

  /** @internal */
  count(holder: string, delta: number): void {
    const n = (this.counts.get(holder) ?? 0) + delta;
    if (n > 0) this.counts.set(holder, n);
    else this.counts.delete(holder);
  }

  /** @internal */
  forget(connection: LiveConnection): void {
    const holder = connection.holder;
    if (!holder) return;
    const set = this.byHolder.get(holder);
    set?.delete(connection);
    if (set?.size === 0) this.byHolder.delete(holder);
  }
}

export class LiveConnection {
  readonly holder: string | undefined;
  /** Subscriptions open on this connection. */
  subscriptions = 0;
  ending: Ending | undefined;
  private readonly controller = new AbortController();
  private closed = false;
  private idleTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly live: LiveCallers,
    private viewer: Viewer,
    private readonly credentials: Credentials,
    private readonly onEnd: (ending: Ending) => void,
    private readonly idle?: IdleClose,
  ) {
    this.holder = credentialHolder(viewer);
    this.armIdle();
  }

  private armIdle(): void {
    if (!this.idle || this.closed || this.ending) return;
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(this.idle.onIdle, this.idle.ms);
    this.idleTimer.unref();
  }

  /** Aborted when the connection's credentials no longer stand. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /**
   * Takes a place for one more subscription, or says why there is none. The check and the count happen in one
   * step, so a burst of subscribe messages cannot all pass the check before any is counted.
   */
  admit(): { ok: true; release: () => void } | { ok: false; message: string } {
    const { perConnection, perCaller } = this.live.limits;
    if (this.ending) return { ok: false, message: this.ending.message };
    if (this.subscriptions >= perConnection) {
      return {
        ok: false,
        message: `this connection already has ${this.subscriptions} subscriptions open, the most one connection may hold (HANGAR_MAX_SUBSCRIPTIONS_PER_CONNECTION): complete some before starting more`,
      };
    }
    const holder = this.holder;
    if (holder && this.live.subscriptionsOf(holder) >= perCaller) {
      return {
        ok: false,
        message: `this caller already has ${this.live.subscriptionsOf(holder)} subscriptions open on this server, the most one caller may hold (HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER): complete some, on any connection, before starting more`,
      };
    }
    this.subscriptions++;
    clearTimeout(this.idleTimer);
    if (holder) this.live.count(holder, 1);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        this.subscriptions--;
        if (holder) this.live.count(holder, -1);
        if (this.subscriptions === 0) this.armIdle();
      },
    };
  }

  /**
   * Asks again who this connection is; ends it if its credentials are gone or carry a lower role. When the
   * check itself fails, `failClosed` ends the connection: after an event, since the change that prompted it
   * has committed and may well be a revocation; not on the periodic sweep, which a database outage would
   * otherwise turn into every live view dropped each minute.
   */
  async recheck({ failClosed }: { failClosed: boolean }): Promise<void> {
    if (this.ending || this.closed) return;
    let now: Viewer;
    try {
      // Past the few seconds AuthService keeps an answer: this check is what catches a change no event told of.
      now = await this.live.deps.auth.identify({ ...this.credentials, fresh: true });
    } catch (err) {
      // The periodic sweep in a database outage would say this for every connection each minute; the loops
      // already say once that the database is gone.
      if (!failClosed) {
        this.live.deps.log.debug('could not check a live connection again', { error: err });
        return;
      }
      this.live.deps.log.warn('could not check a live connection again', { error: err });
      return this.end({ code: 1013, message: 'the server could not check these credentials again: reconnect' });
    }
    if (now.kind === 'anonymous') {
      return this.end({ code: 4401, message: `${now.reason ?? 'these credentials no longer stand'}` });
    }
    const before = viewerRole(this.viewer);
    const after = viewerRole(now);
    if (before && after && !roleAtLeast(after, before)) {
      return this.end({
        code: 4403,
        message: `the role changed from ${before} to ${after}: subscribe again to get what ${after} may see`,
      });
    }
    this.viewer = now;
  }

  /** Stops tracking the connection (it closed). */
  close(): void {
    this.closed = true;
    clearTimeout(this.idleTimer);
    this.live.forget(this);
  }

  private end(ending: Ending): void {
    if (this.ending) return;
    this.ending = ending;
    clearTimeout(this.idleTimer);
    this.controller.abort();
    this.live.forget(this);
    this.onEnd(ending);
  }
}

/**
 * A subscription's events until it ends, or until the signal fires: then `last()` is sent (why it ended) and
 * the source is returned. `finish` runs once, however it ends.
 */
export function endOnSignal<T>(
  source: AsyncIterable<T>,
  signal: AbortSignal,
  last: () => T | undefined,
  finish: () => void,
): AsyncGenerator<T, undefined, undefined> {
  const it = source[Symbol.asyncIterator]();
  let finished = false;
  let lastSent = false;
  const done = { done: true as const, value: undefined };
  const stop = () => {
    if (finished) return;
    finished = true;
    finish();
    void Promise.resolve(it.return?.()).catch(() => {});
  };
  const aborted = new Promise<'aborted'>((resolve) => {
    if (signal.aborted) resolve('aborted');
    else signal.addEventListener('abort', () => resolve('aborted'), { once: true });
  });
  const onAbort = (): IteratorResult<T, undefined> => {
    stop();
    if (lastSent) return done;
    lastSent = true;
    const value = last();
    return value === undefined ? done : { done: false, value };
  };
  const wrapped: AsyncGenerator<T, undefined, undefined> = {
    [Symbol.asyncIterator]() {
      return wrapped;
    },
    async next() {
      if (signal.aborted) return onAbort();
      if (finished) return done;
      const r = await Promise.race([it.next(), aborted]);
      if (r === 'aborted') return onAbort();
      if (r.done) {
        stop();
        return done;
      }
      return r;
    },
    async return() {
      stop();
      return done;
    },
    async throw(err: unknown) {
      stop();
      throw err;
    },
  };
  return wrapped;
}
