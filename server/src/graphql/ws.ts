import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { type DocumentNode, type ExecutionArgs, GraphQLError } from 'graphql';
import { useServer } from 'graphql-ws/use/ws';
import type { WebSocket, WebSocketServer } from 'ws';
import type { AuthService } from '../auth/auth.service.js';
import { clientAddress } from '../auth/client-address.js';
import type { LiveCallers, LiveConnection } from '../auth/live.js';
import type { Viewer } from '../auth/viewer.js';
import type { HangarYoga } from './yoga.js';

type Extra = {
  request: IncomingMessage;
  socket: WebSocket;
  viewer?: Viewer;
  live?: LiveConnection;
  address?: string;
};
type EnvelopedRoot = { execute: (args: ExecutionArgs) => unknown; subscribe: (args: ExecutionArgs) => unknown };

/**
 * graphql-ws on the same port and path as HTTP. Every operation goes through yoga.getEnveloped, so the same
 * schema, context, auth, validation and query limits apply as over HTTP.
 */
export type GraphqlWsDeps = {
  yoga: HangarYoga;
  auth: AuthService;
  live: LiveCallers;
  trustProxy: boolean;
  /** How long a connection may hold no subscription before it is closed (HANGAR_WS_IDLE_SECONDS). */
  idleMs: number;
};

export function attachGraphqlWs(wss: WebSocketServer, { yoga, auth, live, trustProxy, idleMs }: GraphqlWsDeps) {
  return useServer<Record<string, unknown> | undefined, Extra>(
    {
      // Who is calling is settled once per connection: connectionParams.authorization ("Bearer …") for scripts,
      // the session cookie for the console. Anonymous connections are refused: nothing is open to them.
      onConnect: async (ctx) => {
        const params = ctx.connectionParams ?? {};
        const authorization = typeof params.authorization === 'string' ? params.authorization : null;
        const credentials = {
          authorization,
          cookie: authorization ? null : (ctx.extra.request.headers.cookie ?? null),
          csrf: null,
          // The upgrade is a GET whose Origin was checked before it was accepted (app.ts).
          method: 'GET',
        };
        const viewer = await auth.identify(credentials);
        if (viewer.kind === 'anonymous') {
          // 4403 as graphql-ws would close it (the console reads it as "signed out"), but with the reason, such
          // as "… is a caller token: it calls models at /v1 and nothing else", rather than a bare "Forbidden".
          if (viewer.reason) ctx.extra.socket.close(4403, closeReason(viewer.reason));
          return false;
        }
        // 1013, "try again later": graphql-ws clients retry it with a backoff, and a slot may be free by then.
        const refusal = live.connectionRefusal(viewer);
        if (refusal) {
          ctx.extra.socket.close(1013, closeReason(refusal));
          return false;
        }
        ctx.extra.viewer = viewer;
        ctx.extra.address = clientAddress(
          ctx.extra.request.socket.remoteAddress,
          ctx.extra.request.headers['x-forwarded-for'],
          trustProxy,
        );
        // Checked again whenever this caller's credentials change; the socket is closed with the reason when
        // they no longer stand, which ends every subscription on it (graphql-ws returns their iterators).
        const socket = ctx.extra.socket;
        // A socket that holds no subscription is a slot held for nothing (the console's client closes its own
        // when its last subscription ends). 1000: a graphql-ws client reconnects only if it has work to do.
        const idle = {
          ms: idleMs,
          onIdle: () =>
            socket.close(
              1000,
              closeReason(
                `no subscription for ${idleMs / 1000} s (HANGAR_WS_IDLE_SECONDS): subscribe to stay connected`,
              ),
            ),
        };
        ctx.extra.live = live.open(
          viewer,
          credentials,
          (ending) => socket.close(ending.code, closeReason(ending.message)),
          idle,
        );
        return true;
      },
      onClose: (ctx) => {
        ctx.extra.live?.close();
      },
      execute: (args) => (args.rootValue as EnvelopedRoot).execute(args) as never,
      subscribe: (args) => (args.rootValue as EnvelopedRoot).subscribe(args) as never,
      onSubscribe: async (ctx, _id, payload) => {
        const headers = new Headers();
        for (const [k, v] of Object.entries(ctx.extra.request.headers)) {
          if (typeof v === 'string') headers.set(k, v);
        }
        const request = new Request(`http://${headers.get('host') ?? 'hangar'}/graphql`, { headers });
        const { schema, execute, subscribe, contextFactory, parse, validate } = yoga.getEnveloped({
          request,
          params: payload,
          viewer: ctx.extra.viewer,
          requestId: randomUUID(),
          live: ctx.extra.live,
          clientAddress: ctx.extra.address,
        });
        // Parse errors and the query limits (which reject by throwing) go back to the client as errors for this
        // operation, as over HTTP, instead of tearing down the whole connection.
        let document: DocumentNode;
        try {
          document = parse(payload.query);
          const errors = validate(schema, document);
          if (errors.length) return errors;
        } catch (err) {
          return [
            err instanceof Error && err.name === 'GraphQLError'
              ? (err as GraphQLError)
              : new GraphQLError('invalid operation'),
          ];
        }
        return {
          schema,
          operationName: payload.operationName,
          document,
          variableValues: payload.variables,
          contextValue: await contextFactory(),
          rootValue: { execute, subscribe },
        } satisfies ExecutionArgs;
      },
    },
    wss,
  );
}

/** A close reason is at most 123 bytes (RFC 6455); a longer one would make ws throw instead of closing. */
function closeReason(message: string): string {
  let reason = message;
  while (Buffer.byteLength(reason) > 123) reason = `${reason.slice(0, -2)}…`;
  return reason;
}
