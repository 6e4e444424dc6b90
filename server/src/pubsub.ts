import type { Logger } from '@hangar/common/log';
import { Repeater } from 'graphql-yoga';
import pg from 'pg';
import type { Db, Tx } from './db/client.js';
import { connectionOptions } from './db/connections.js';
import { databaseBack, outageBackoffMs, outageReason, whenDatabaseAnswers } from './db/outage.js';

// Live updates go through PostgreSQL's NOTIFY. It is transactional: an event sent inside the transaction that
// made a change is delivered only when that change commits, so a subscriber never hears of a row it cannot
// read yet, nor of one that was rolled back. And every server replica listening on the same database hears
// it, so subscriptions work behind a load balancer without another moving part.

export type Topics = {
  auditEvent: [id: string];
  /**
   * "user:<id>" or "node:<id>": something that decides what that holder may do changed (a token revoked, the
   * user disabled or given another role, a session ended). Every live connection of that holder checks its
   * credentials again and ends if they no longer stand.
   */
  credentials: [holder: string];
  /** A limit's scope: it was set, changed or removed (governance/limits.service.ts); every process reads them again. */
  limits: [scope: string];
  /** "model/version": a version's files changed (state, bytes, removal). */
  mirrorVersion: [key: string];
  /**
   * A catalog model's id: it, one of its replicas or one of its adapters changed (or it was removed). Sent by the
   * database itself (the triggers catalog/model-events.ts installs at start), not by the services.
   */
  model: [id: string];
  /** A price was set or removed (governance/cost-prices.ts): every process reads its prices again. */
  pricing: [key: string];
  /** A serve job's id: its state or a step changed. */
  serveJob: [id: string];
  /** A training job's id: its state, progress, events or artifacts changed. */
  trainJob: [id: string];
  /** A node's id: its training work may have changed (a job queued, cancelled or ended; the node reported). */
  trainWork: [nodeId: string];
  /**
   * A node's id: its serving work may have changed (a replica placed on it, told to stop, ended or moved). Sent by
   * the database itself (the trigger fleet/serving-work.ts installs at start).
   */
  servingWork: [nodeId: string];
};
export type Topic = keyof Topics;

const CHANNEL = 'hangar_events';

export type PubSub = {
  subscribe<T extends Topic>(topic: T): AsyncIterable<Topics[T][0]>;
  publish<T extends Topic>(topic: T, ...args: Topics[T]): void;
  /**
   * One read per event, shared by every subscriber that resolves it: the first call for (topic, id, read) since
   * that event was published loads, the others get the same promise (and so the same object). `read` names
   * what is loaded and everything it depends on: a read that differs by who asks puts the asker's class in it.
   * Each subscriber still passes its own authorization first; only the loading is shared.
   */
  shared<R>(topic: Topic, id: string, read: string, load: () => Promise<R>): Promise<R>;
  /**
   * The same, keyed by the id alone, for those that do not know the topic: a subscription's whole result
   * (graphql/shared-results.ts), whose `read` names the document, variables and caller. Any topic's event
   * with that id starts afresh, which at worst shares less.
   */
  sharedEvent<R>(id: string, read: string, load: () => Promise<R>): Promise<R>;
};

/** How long an event's reads are kept for subscribers still resolving it; a later one reads again (fresher). */
const SHARED_FOR_MS = 5000;

/**
 * Each event is resolved once for all its subscribers, not once by each: at 1000 subscribers every event
 * used to read the same row 1000 times, and the delay and memory grew with them (#17). Fanned out here rather
 * than through an EventTarget, which warns of a leak past 10 listeners and would at every busy page.
 */
export function makePubSub(): PubSub {
  const subscribers = new Map<Topic, Set<(id: string) => unknown>>();
  // By `${topic} ${id}`, oldest first: the reads made since that key's latest event. And by id alone.
  const reads = new Map<string, EventReads>();
  const readsById = new Map<string, EventReads>();
  return {
    subscribe: (topic) =>
      new Repeater<string>(async (push, stop) => {
        let set = subscribers.get(topic);
        if (!set) {
          set = new Set();
          subscribers.set(topic, set);
        }
        set.add(push);
        await stop;
        set.delete(push);
      }),
    publish: (topic, id) => {
      const now = Date.now();
      // A new event: what was read for the one before may be out of date, so its reads are not handed out again.
      renew(reads, `${topic} ${id}`, now);
      renew(readsById, id, now);
      for (const push of subscribers.get(topic) ?? []) push(id);
    },
    shared: (topic, id, read, load) => sharedRead(reads.get(`${topic} ${id}`), read, load),
    sharedEvent: (id, read, load) => sharedRead(readsById.get(id), read, load),
  };
}

type EventReads = { at: number; loads: Map<string, Promise<unknown>> };

/** Starts `key`'s reads afresh for a new event, and forgets those of events older than SHARED_FOR_MS. */
function renew(byKey: Map<string, EventReads>, key: string, now: number) {
  for (const [old, entry] of byKey) {
    if (now - entry.at < SHARED_FOR_MS) break;
    byKey.delete(old);
  }
  byKey.delete(key);
  byKey.set(key, { at: now, loads: new Map() });
}

/** The first caller since the event loads; the others get its promise. */
function sharedRead<R>(entry: EventReads | undefined, read: string, load: () => Promise<R>): Promise<R> {
  // No event of this key in the last few seconds (a subscriber far behind): its own read, not kept.
  if (!entry) return load();
  const { loads } = entry;
  let loading = loads.get(read) as Promise<R> | undefined;
  if (!loading) {
    loading = load();
    loads.set(read, loading);
    // A failed read is not handed to the next subscriber: it tries for itself.
    loading.catch(() => {
      if (loads.get(read) === loading) loads.delete(read);
    });
  }
  return loading;
}

/** Queues an event in the current transaction (or at once, outside one); it is published on commit. */
export async function notify(db: Db | Tx, topic: Topic, id: string): Promise<void> {
  await db.$executeRaw`SELECT pg_notify(${CHANNEL}, ${JSON.stringify({ topic, id })})`;
  for (const hook of localHooks) hook(topic, id);
}

type LocalHook = (topic: Topic, id: string) => void;
const localHooks = new Set<LocalHook>();

/**
 * Hears this process's own events when they are queued, before they commit and long before they come back
 * over LISTEN: a cache of credentials (auth/credential-cache.ts) drops a revoked token at once, so the admin's
 * very next request with it is refused rather than served in the milliseconds the event takes to return.
 * Nothing must be published from here: the change may not have committed yet, and may roll back.
 */
export function onLocalNotify(hook: LocalHook): () => void {
  localHooks.add(hook);
  return () => localHooks.delete(hook);
}

export type Listener = {
  /** Whether the database's events reach this process now; /readyz says so when they do not. */
  listening(): boolean;
  /** Since when they have reached it without a break (a Date.now()); undefined while they do not. */
  listeningSince(): number | undefined;
  stop(): Promise<void>;
};

/**
 * Listens on the database and republishes each event in this process. A lost connection (PostgreSQL restarted,
 * failed over, or not up yet at the first try) is retried with a backoff until it answers, logged once when
 * lost and once when back, and never thrown: without it live views go quiet, but nothing else stops.
 */
export async function listen(databaseUrl: string, pubsub: PubSub, log: Logger): Promise<Listener> {
  let client: pg.Client | undefined;
  let closed = false;
  let retry: NodeJS.Timeout | undefined;
  let stopWaking: (() => void) | undefined;
  let failures = 0;
  let lostAt: number | null = null;
  let connectedAt = 0;

  const lost = (err: unknown) => {
    if (lostAt !== null) return;
    lostAt = Date.now();
    log.warn(
      'live events: no connection to the database; reconnecting until it answers (subscriptions hear nothing meanwhile)',
      {
        reason: err === undefined ? 'the connection ended' : outageReason(err),
      },
    );
  };
  const scheduleReconnect = () => {
    if (closed || retry) return;
    failures++;
    const again = () => {
      stopWaking?.();
      stopWaking = undefined;
      if (!retry) return;
      clearTimeout(retry);
      retry = undefined;
      void connect();
    };
    retry = setTimeout(again, outageBackoffMs(failures));
    // A loop that gets through means the database is back: no need to wait out the backoff.
    stopWaking = whenDatabaseAnswers(again);
  };
  const connect = async () => {
    // A connection attempt gives up after 10 s: a host that does not answer at all (the old primary's machine, gone)
    // would otherwise hold the reconnection for as long as the kernel waits, minutes.
    const c = new pg.Client({
      connectionString: databaseUrl,
      ...connectionOptions('events'),
      connectionTimeoutMillis: 10_000,
    });
    let dropped = false;
    const drop = (err?: unknown) => {
      if (dropped || closed) return;
      dropped = true;
      if (client === c) client = undefined;
      c.end().catch(() => {});
      lost(err);
      scheduleReconnect();
    };
    c.on('notification', (msg) => {
      try {
        const { topic, id } = JSON.parse(msg.payload ?? '') as { topic: Topic; id: string };
        pubsub.publish(topic, id);
      } catch (err) {
        log.warn('ignored a malformed event', { payload: msg.payload, error: err });
      }
    });
    c.on('error', (err) => drop(err));
    c.on('end', () => drop());
    try {
      await c.connect();
      await c.query(`LISTEN ${CHANNEL}`);
    } catch (err) {
      drop(err);
      return;
    }
    if (closed || dropped) {
      await c.end().catch(() => {});
      return;
    }
    client = c;
    connectedAt = Date.now();
    failures = 0;
    if (lostAt !== null) {
      log.info('live events: listening again', { afterSeconds: Math.round((Date.now() - lostAt) / 1000) });
      lostAt = null;
      databaseBack();
    }
  };
  await connect();
  return {
    listening: () => client !== undefined,
    listeningSince: () => (client !== undefined ? connectedAt : undefined),
    stop: async () => {
      closed = true;
      if (retry) clearTimeout(retry);
      stopWaking?.();
      await client?.end().catch(() => {});
    },
  };
}

const fieldReads = new WeakMap<object, Map<string, Promise<unknown>>>();

/**
 * A field's own read on an entity an event was resolved to once (PubSub.shared hands each subscriber the same
 * object): made once for all of them, keyed by that object, so it lasts as long as the event's delivery does.
 * Only in subscriptions: a query's or a mutation's parent is its own, and a mutation may change what is read.
 */
export function sharedField<R>(
  parent: object,
  info: { operation: { operation: string } },
  read: string,
  load: () => Promise<R>,
): Promise<R> {
  if (info.operation.operation !== 'subscription') return load();
  let loads = fieldReads.get(parent);
  if (!loads) {
    loads = new Map();
    fieldReads.set(parent, loads);
  }
  let loading = loads.get(read) as Promise<R> | undefined;
  if (!loading) {
    loading = load();
    loads.set(read, loading);
    const mine = loads;
    loading.catch(() => {
      if (mine.get(read) === loading) mine.delete(read);
    });
  }
  return loading;
}
