import { createPubSub } from 'graphql-yoga';
import pg from 'pg';
import type { Db, Tx } from './db/client.js';
import type { Logger } from './lib/log.js';

// Live updates go through PostgreSQL's NOTIFY. It is transactional: an event sent inside the transaction that
// made a change is delivered only when that change commits, so a subscriber never hears of a row it cannot
// read yet, nor of one that was rolled back. And every server replica listening on the same database hears
// it, so subscriptions work behind a load balancer without another moving part.

export type Topics = {
  auditEvent: [id: string];
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
}

/** Listens on the database and republishes each event in this process; returns a function that stops it. */
export async function listen(databaseUrl: string, pubsub: PubSub, log: Logger): Promise<() => Promise<void>> {
  let client: pg.Client | undefined;
  let closed = false;
  let retry: NodeJS.Timeout | undefined;
  const connect = async () => {
    const c = new pg.Client({ connectionString: databaseUrl });
    c.on('notification', (msg) => {
      try {
        const { topic, id } = JSON.parse(msg.payload ?? '') as { topic: Topic; id: string };
        pubsub.publish(topic, id);
      } catch (err) {
        log.warn('ignored a malformed event', { payload: msg.payload, error: err });
      }
    });
    // A dropped connection would silently stop every live view: reconnect, and let clients re-read state.
    c.on('error', (err) => {
      log.warn('event listener lost its connection; reconnecting', { error: err });
      scheduleReconnect();
    });
    await c.connect();
    await c.query(`LISTEN ${CHANNEL}`);
    client = c;
  };
  const scheduleReconnect = () => {
    if (closed || retry) return;
    client?.end().catch(() => {});
    client = undefined;
    retry = setTimeout(() => {
      retry = undefined;
      connect().catch(() => scheduleReconnect());
    }, 1000);
  };
  await connect();
  return async () => {
    closed = true;
    if (retry) clearTimeout(retry);
    await client?.end().catch(() => {});
  };
}
