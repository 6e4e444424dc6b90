import { createPubSub } from 'graphql-yoga';
import pg from 'pg';
import type { Db, Tx } from './db/client.js';
import { outageReason } from './db/outage.js';
import type { Logger } from './lib/log.js';

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
  /** "model/version": a version's files changed (state, bytes, removal). */
  mirrorVersion: [key: string];
  /** A serve job's id: its state or a step changed. */
  serveJob: [id: string];
  /** A training job's id: its state, progress, events or artifacts changed. */
  trainJob: [id: string];
  /** A node's id: its training work may have changed (a job queued, cancelled or ended; the node reported). */
  trainWork: [nodeId: string];
};
export type Topic = keyof Topics;

const CHANNEL = 'hangar_events';

export const makePubSub = () => createPubSub<Topics>();
export type PubSub = ReturnType<typeof makePubSub>;

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
    retry = setTimeout(
      () => {
        retry = undefined;
        void connect();
      },
      Math.min(5000, 250 * 2 ** Math.min(failures, 10)),
    );
  };
  const connect = async () => {
    const c = new pg.Client({ connectionString: databaseUrl, keepAlive: true });
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
    }
  };
  await connect();
  return {
    listening: () => client !== undefined,
    listeningSince: () => (client !== undefined ? connectedAt : undefined),
    stop: async () => {
      closed = true;
      if (retry) clearTimeout(retry);
      await client?.end().catch(() => {});
    },
  };
}
