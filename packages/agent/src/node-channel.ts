import type { Logger } from '@hangar/common/log';
import { backoffMs, sleep } from '@hangar/common/retry';
import type { TadaDocumentNode } from 'gql.tada';
import { print } from 'graphql';
import { type Client, createClient } from 'graphql-ws';
import WebSocket from 'ws';

// The one WebSocket between a node agent and the control plane (graphql-ws, the node token): the work the
// control plane pushes to the node travels on it, its training jobs (train-control.ts) and its replicas
// (control-plane.ts) alike, each as a subscription that sends the whole list when it starts and again after
// every change. It reconnects for good, with backoff, and every subscription is asked for again on the new
// socket, so a node that lost the control plane (a restart, a network cut) catches up from a full list.
// Reports and claims go over HTTP (control-plane.ts's graphqlRequest).

export type NodeChannelOptions = {
  /** The control plane's base URL (http[s]://…); the socket is its /graphql over ws[s]. */
  url: string;
  token: string;
  log?: Logger;
  /** The longest wait between reconnection tries; they start at a tenth of it and double. */
  reconnectMaxMs?: number;
  /** A ping this often; no pong within half of it and the socket is taken for dead and replaced. */
  keepAliveMs?: number;
  /** After a subscription ended with an error (the server refused it), it is asked for again after this. */
  resubscribeMs?: number;
};

/** Told when the socket is up (`back`: after it was lost) and when it is lost. */
export type ChannelListener = { up?: (back: boolean) => void; down?: (why: string) => void };

export type ChannelSubscription<R> = {
  /** What the subscription is, for the log: "training work", "serving work". */
  what: string;
  /** Each result's data (null when it came with errors only); errors are logged here. */
  next: (data: R | null) => void;
};

export class NodeChannel {
  private client: Client | undefined;
  private readonly listeners = new Set<ChannelListener>();
  private closed = false;
  /** Why the socket is not connected (undefined: it is, or it was never opened). */
  private lost: string | undefined;
  private connectedNow = false;

  constructor(private readonly o: NodeChannelOptions) {}

  /** Whether the socket is connected now. */
  get up(): boolean {
    return this.connectedNow;
  }

  onConnection(listener: ChannelListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Subscribes on the shared socket (opened by the first subscription); the server sends the whole list at
   * once, and again on every reconnect. Returns the unsubscribe.
   */
  subscribe<R>(doc: TadaDocumentNode<R, Record<string, never>>, s: ChannelSubscription<R>): () => void {
    const client = this.open();
    const log = this.o.log;
    let ended = false;
    let resubscribe: NodeJS.Timeout | undefined;
    let dispose: (() => void) | undefined;
    const again = () => {
      if (!ended && !this.closed) resubscribe = setTimeout(go, this.o.resubscribeMs ?? 30_000);
    };
    const go = () => {
      dispose = client.subscribe<R>(
        { query: print(doc) },
        {
          next: (result) => {
            if (result.errors?.length)
              log?.warn(`the ${s.what} list came with errors`, {
                error: result.errors.map((e) => e.message).join('; '),
              });
            s.next((result.data as R | null | undefined) ?? null);
          },
          // The server refused the subscription (an older control plane without it, a revoked token): ask again
          // later rather than never, since the operator can fix either without touching the node.
          error: (err) => {
            if (ended || this.closed) return;
            log?.warn(`the control plane refused the ${s.what} subscription; asking again later`, {
              error: describe(err),
            });
            again();
          },
          complete: again,
        },
      );
    };
    go();
    return () => {
      ended = true;
      clearTimeout(resubscribe);
      dispose?.();
    };
  }

  /** Closes the socket for good (the agent is stopping). */
  close() {
    this.closed = true;
    this.connectedNow = false;
    const client = this.client;
    this.client = undefined;
    // Disposing while a reconnect is under way rejects with that connection's error (the control plane down,
    // say): the agent is stopping, so there is nothing to tell, and unhandled it would crash the process.
    if (client) Promise.resolve(client.dispose()).catch(() => {});
  }

  private open(): Client {
    if (this.client) return this.client;
    const log = this.o.log;
    const keepAlive = this.o.keepAliveMs ?? 10_000;
    const maxWait = this.o.reconnectMaxMs ?? 10_000;
    let lastError: string | undefined;
    let pongTimer: NodeJS.Timeout | undefined;
    const client: Client = createClient({
      url: `${this.o.url.replace(/^http/, 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${this.o.token}` },
      // Connected from the start and for good: the work is pushed, and a reconnect is how a restarted control
      // plane's lists reach the node (the server sends the whole list on every subscription).
      lazy: false,
      retryAttempts: Number.POSITIVE_INFINITY,
      // The default retries only on close events; a refused TCP connection (the server restarting) arrives as an
      // error event, and giving up on it would leave the node deaf to its work until the agent restarts.
      shouldRetry: () => true,
      retryWait: (retries) => sleep(backoffMs(retries, { baseMs: maxWait / 10, maxMs: maxWait, jitter: 0.5 })),
      onNonLazyError: (err) => log?.warn('the connection to the control plane gave up', { error: describe(err) }),
      keepAlive,
      on: {
        // graphql-ws pings but does not notice a missing pong: a half-open socket (a node whose network dropped
        // without a FIN) would wait forever. Terminating it makes the client reconnect.
        ping: (received) => {
          if (!received) pongTimer = setTimeout(() => client.terminate(), keepAlive / 2);
        },
        pong: (received) => {
          if (received) clearTimeout(pongTimer);
        },
        connected: () => {
          const back = this.lost !== undefined;
          this.lost = undefined;
          this.connectedNow = true;
          if (back) log?.info('the work channel to the control plane is connected again');
          for (const l of this.listeners) l.up?.(back);
        },
        // A refused connection is an error event and then a close: the error says why, the close says it ended.
        error: (err) => {
          lastError = describe(err);
        },
        closed: (event) => {
          clearTimeout(pongTimer);
          this.connectedNow = false;
          if (this.closed) return;
          const why = lastError ?? describe(event);
          lastError = undefined;
          // Once per outage: a control plane down for an hour should not write a line per retry.
          const first = this.lost === undefined;
          if (first) log?.warn('the work channel to the control plane is not connected; reconnecting', { error: why });
          this.lost = why;
          if (first) for (const l of this.listeners) l.down?.(why);
        },
      },
    });
    this.client = client;
    return client;
  }
}

export function describe(err: unknown): string {
  if (Array.isArray(err)) return err.map((e) => describe(e)).join('; ');
  const e = err as {
    message?: string;
    code?: number | string;
    reason?: string;
    cause?: { code?: string; message?: string };
  };
  if (e && typeof e === 'object' && 'code' in e && 'reason' in e)
    return `closed ${e.code}${e.reason ? `: ${e.reason}` : ''}`;
  const cause = e?.cause?.code ?? e?.cause?.message;
  const msg = e?.message ?? String(err);
  return cause ? `${msg} (${cause})` : msg;
}
