import { type ExecutionResult, GraphQLError } from 'graphql';
import { isAsyncIterable, type Plugin } from 'graphql-yoga';
import { CSRF_HEADER } from '../auth/cookies.js';
import { endOnSignal, type LiveCallers, type LiveConnection } from '../auth/live.js';
import type { Context } from '../context.js';

// Every subscription, over SSE or WebSocket (graphql/ws.ts goes through the same envelop), passes here:
// refused at once for anonymous callers, counted against the caps, and ended when its caller's credentials
// stop standing. A WebSocket brings its connection in the context; an SSE request is a connection of its own.

export const TOO_MANY_SUBSCRIPTIONS = 'TOO_MANY_SUBSCRIPTIONS';
export const TOO_MANY_CONNECTIONS = 'TOO_MANY_CONNECTIONS';

export function liveSubscriptions(live: LiveCallers): Plugin<Context> {
  return {
    onSubscribe({ args, setResultAndStopExecution }) {
      const ctx = args.contextValue;
      if (ctx.viewer.kind === 'anonymous') {
        // Refused as a whole, with a 401, rather than held open with an error per event: nothing is open to
        // anonymous callers, and a stream they can hold costs the server for nothing.
        setResultAndStopExecution({
          errors: [
            new GraphQLError(
              ctx.viewer.reason ??
                'subscriptions need a caller: sign in to the console, or send "Authorization: Bearer <token>" with an API token',
              { extensions: { code: 'UNAUTHENTICATED', http: { status: 401 } } },
            ),
          ],
        });
        return;
      }
      if (ctx.viewer.kind === 'system') return;
      // An SSE stream is a live connection of its own, counted in its caller's share as a WebSocket is.
      const refusal = ctx.live ? undefined : live.connectionRefusal(ctx.viewer);
      if (refusal) {
        setResultAndStopExecution({
          errors: [new GraphQLError(refusal, { extensions: { code: TOO_MANY_CONNECTIONS, http: { status: 429 } } })],
        });
        return;
      }
      const connection: LiveConnection =
        ctx.live ??
        live.open(
          ctx.viewer,
          {
            authorization: ctx.request.headers.get('authorization'),
            cookie: ctx.request.headers.get('cookie'),
            csrf: ctx.request.headers.get(CSRF_HEADER),
            method: ctx.request.method,
          },
          // The SSE stream ends through the signal below; there is no socket to close.
          () => {},
        );
      const place = connection.admit();
      if (!place.ok) {
        if (!ctx.live) connection.close();
        setResultAndStopExecution({
          errors: [new GraphQLError(place.message, { extensions: { code: TOO_MANY_SUBSCRIPTIONS } })],
        });
        return;
      }
      const finish = () => {
        place.release();
        if (!ctx.live) connection.close();
      };
      return {
        onSubscribeResult({ result, setResult }) {
          if (!isAsyncIterable(result)) return finish();
          // Why the stream ended, as its last event: an SSE client has no close code to read.
          const last = (): ExecutionResult | undefined => {
            const ending = connection.ending;
            if (!ending) return undefined;
            // 1013: the credentials could not be checked (the database away): try again, not sign in again.
            const code = ending.code === 4403 ? 'FORBIDDEN' : ending.code === 1013 ? 'UNAVAILABLE' : 'UNAUTHENTICATED';
            return { errors: [new GraphQLError(`subscription ended: ${ending.message}`, { extensions: { code } })] };
          };
          setResult(endOnSignal(result, connection.signal, last, finish));
        },
      };
    },
  };
}
