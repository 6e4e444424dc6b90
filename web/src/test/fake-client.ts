// A urql client for unit tests: the console's real graphcache (schema, keys, updaters) in front of a fake
// exchange that answers operations by name, in place of the HTTP and WebSocket transports. Like fetchExchange, it
// answers asynchronously and drops an operation torn down before its answer. Browser tests against the real
// server live in e2e/.
import { cacheExchange } from '@urql/exchange-graphcache';
import {
  type AnyVariables,
  Client,
  type Exchange,
  getOperationName,
  makeErrorResult,
  makeResult,
  type Operation,
  type TypedDocumentNode,
} from 'urql';
import { delay, filter, fromValue, makeSubject, map, mergeMap, pipe, share, takeUntil } from 'wonka';
import { cacheConfig } from '../graphql/cache';
import { pairUncached } from '../graphql/client';

type Data = Record<string, unknown>;
type Answer = { name: string; resolve: (variables: Data) => Data };

/** How the fake server answers one query or mutation document (the data as the server would send it). */
export function answer<Variables extends AnyVariables>(
  document: TypedDocumentNode<unknown, Variables>,
  resolve: (variables: Variables) => Data,
): Answer {
  return { name: getOperationName(document) ?? '', resolve: resolve as Answer['resolve'] };
}

export function fakeClient(answers: Answer[]) {
  const resolvers = new Map(answers.map((a) => [a.name, a.resolve]));
  const operations: Operation[] = [];
  const events = makeSubject<{ name: string; data: Data }>();

  const fake: Exchange = () => (ops$) => {
    const shared = pipe(ops$, share);
    return pipe(
      shared,
      filter((op) => op.kind !== 'teardown'),
      mergeMap((op) => {
        const name = getOperationName(op.query) ?? '';
        const teardown$ = pipe(
          shared,
          filter((t) => t.kind === 'teardown' && t.key === op.key),
        );
        if (op.kind === 'subscription') {
          operations.push(op);
          return pipe(
            events.source,
            filter((e) => e.name === name),
            map((e) => makeResult(op, { data: e.data })),
            takeUntil(teardown$),
          );
        }
        return pipe(
          fromValue(op),
          delay(0),
          map(() => {
            operations.push(op);
            const resolve = resolvers.get(name);
            if (!resolve) return makeErrorResult(op, new Error(`the fake server has no answer for ${name}`));
            return makeResult(op, { data: resolve(op.variables as Data) });
          }),
          takeUntil(teardown$),
        );
      }),
    );
  };

  const client = new Client({ url: 'http://hangar.test/graphql', exchanges: [cacheExchange(cacheConfig), fake] });
  // As makeClient does: the same server without the cache, for the views that keep their own data.
  pairUncached(client, new Client({ url: 'http://hangar.test/graphql', exchanges: [fake] }));
  return {
    client,
    /** Every operation the "server" answered, in order. */
    operations,
    /** The operations of this document the "server" answered (subscriptions: that were opened). */
    sent: <Variables extends AnyVariables>(document: TypedDocumentNode<unknown, Variables>) =>
      operations
        .filter((op) => getOperationName(op.query) === getOperationName(document))
        .map((op) => op as Operation<unknown, Variables>),
    /** Delivers an event to every open subscription of this document. */
    push: <Variables extends AnyVariables>(document: TypedDocumentNode<unknown, Variables>, data: Data) =>
      events.next({ name: getOperationName(document) ?? '', data }),
  };
}
