import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { type DocumentNode, type ExecutionArgs, GraphQLError } from 'graphql';
import { useServer } from 'graphql-ws/use/ws';
import type { WebSocketServer } from 'ws';
import type { AuthService } from '../auth/auth.service.js';
import type { Viewer } from '../auth/viewer.js';
import type { HangarYoga } from './yoga.js';

type Extra = { request: IncomingMessage; viewer?: Viewer };
type EnvelopedRoot = { execute: (args: ExecutionArgs) => unknown; subscribe: (args: ExecutionArgs) => unknown };

/**
 * graphql-ws on the same port and path as HTTP. Every operation goes through yoga.getEnveloped, so the same
 * schema, context, auth, validation and query limits apply as over HTTP.
 */
export function attachGraphqlWs(wss: WebSocketServer, yoga: HangarYoga, auth: AuthService) {
  return useServer<Record<string, unknown> | undefined, Extra>(
    {
      // Who is calling is settled once per connection: connectionParams.authorization ("Bearer …") for scripts,
      // the session cookie for the console. Anonymous connections are refused: nothing is open to them.
      onConnect: async (ctx) => {
        const params = ctx.connectionParams ?? {};
        const authorization = typeof params.authorization === 'string' ? params.authorization : null;
        const viewer = await auth.identify({
          authorization,
          cookie: authorization ? null : (ctx.extra.request.headers.cookie ?? null),
          csrf: null,
          // The upgrade is a GET whose Origin was checked before it was accepted (app.ts).
          method: 'GET',
        });
        if (viewer.kind === 'anonymous') return false;
        ctx.extra.viewer = viewer;
        return true;
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
