import { cacheExchange } from '@urql/exchange-graphcache';
import { createClient as createWsClient } from 'graphql-ws';
import { Client, fetchExchange, subscriptionExchange } from 'urql';
import { cacheConfig } from './cache';
import { csrfHeaders } from './csrf';
import { live, sessionEnded } from './live';

/** The console's client: graphcache (schema-aware), HTTP for queries and mutations, graphql-ws for subscriptions. */
export function makeClient(origin: string = window.location.origin): Client {
  const wsUrl = new URL('/graphql', origin);
  wsUrl.protocol = wsUrl.protocol === 'https:' ? 'wss:' : 'ws:';
  // The browser sends the session cookie with the upgrade and the server checks its Origin: no connectionParams.
  const ws = createWsClient({
    url: wsUrl.href,
    lazy: true,
    // A server restart or a network blip: keep trying (with graphql-ws's backoff). A refusal: the session ended.
    retryAttempts: Number.POSITIVE_INFINITY,
    shouldRetry: (event) => !sessionEnded(event),
    on: {
      connecting: (isRetry) => live.set(isRetry ? 'reconnecting' : 'connecting'),
      connected: (_socket, _payload, wasRetry) => live.set('live', wasRetry),
      closed: (event) => {
        if (sessionEnded(event)) live.set('stopped');
      },
    },
  });
  const transports = [
    fetchExchange,
    subscriptionExchange({
      forwardSubscription: (request) => {
        const input = { ...request, query: request.query ?? '' };
        return { subscribe: (sink) => ({ unsubscribe: ws.subscribe(input, sink) }) };
      },
    }),
  ];
  const options = {
    url: new URL('/graphql', origin).href,
    preferGetMethod: false,
    // A function, so the CSRF cookie is read when each request is sent, not when the client is made.
    fetchOptions: (): RequestInit => ({ credentials: 'same-origin', headers: csrfHeaders() }),
  };
  const client = new Client({ ...options, exchanges: [cacheExchange(cacheConfig), ...transports] });
  // The same transports (and the one socket) without the cache, for the Mirror page's listing.
  pairUncached(client, new Client({ ...options, exchanges: transports }));
  return client;
}

const uncached = new WeakMap<Client, Client>();

/**
 * Gives `client` a twin without graphcache, for views whose data is too big to normalise and that keep it
 * themselves (the Mirror page at thousands of versions: graphcache took most of its first load and of every event).
 */
export function pairUncached(client: Client, twin: Client): void {
  uncached.set(client, twin);
}

/** The twin without a cache of `client`, or `client` itself where it has none (it works, only slower). */
export function uncachedClient(client: Client): Client {
  return uncached.get(client) ?? client;
}
