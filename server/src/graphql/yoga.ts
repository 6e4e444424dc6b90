import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { useGraphQlJit } from '@envelop/graphql-jit';
import { EnvelopArmorPlugin } from '@escape.tech/graphql-armor';
import type { Logger } from '@hangar/common/log';
import { GraphQLError, getOperationAST } from 'graphql';
import { createYoga, type GraphiQLOptions, type Plugin } from 'graphql-yoga';
import type { Registry } from 'prom-client';
import { actorOf } from '../auth/actor.js';
import { clientAddress } from '../auth/client-address.js';
import { CSRF_COOKIE, CSRF_HEADER } from '../auth/cookies.js';
import type { LiveCallers } from '../auth/live.js';
import type { Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import type { Context, Services } from '../context.js';
import type { Db } from '../db/client.js';
import { compressAnswers } from '../http/compress.js';
import { clientRequestIdOf, requestIdFromEdge } from '../http/routes.js';
import { GRAPHIQL_HEADERS } from '../http/static.js';
import { isHangarError } from '../lib/errors.js';
import { graphqlMetrics } from '../metrics/graphql-metrics.js';
import type { PubSub } from '../pubsub.js';
import { schema } from '../schema/index.js';
import type { Tracing } from '../telemetry/tracing.js';
import { requestGuards } from './guards.js';
import { shareSubscriptionResults } from './shared-results.js';
import { liveSubscriptions } from './subscriptions.js';

/** What a request carries before its GraphQL context exists: worked out once, read by several hooks. */
type RequestState = { viewer: Viewer; requestId: string; cookies: string[]; secure: boolean };

export type YogaDeps = {
  prisma: Db;
  config: Config;
  log: Logger;
  pubsub: PubSub;
  services: Services;
  /** Live connections and their subscriptions: caps, and ending them when credentials change. */
  live: LiveCallers;
  /** Where GraphQL's Prometheus figures go (metrics/metrics.ts serves them); none, none are kept. */
  metrics?: Registry;
  /** OpenTelemetry (telemetry/tracing.ts); absent, tracing is off and adds nothing to a request. */
  tracing?: Tracing;
  /** Told of each subscription event result: executed for its subscriber, or shared from another's. */
  onSubscriptionResult?: (how: 'executed' | 'shared') => void;
};

// Limits against abusive queries, the same on HTTP and WebSocket (both go through these envelop plugins).
export const queryLimits = { maxDepth: 12, maxCost: 5000, maxAliases: 20, maxTokens: 3000, maxDirectives: 20 };

export function buildYoga(deps: YogaDeps) {
  const { config, log, services } = deps;
  const states = new WeakMap<Request, RequestState>();
  const edgeIds = new WeakMap<Request, string>();

  const stateOf = async (request: Request): Promise<RequestState> => {
    let state = states.get(request);
    if (!state) {
      const viewer = await services.auth.identify({
        authorization: request.headers.get('authorization'),
        cookie: request.headers.get('cookie'),
        csrf: request.headers.get(CSRF_HEADER),
        method: request.method,
      });
      const secure =
        request.url.startsWith('https:') ||
        request.headers.get('x-forwarded-proto') === 'https' ||
        Boolean(config.publicUrl?.startsWith('https:'));
      state = {
        viewer,
        // The edge's id for this request (http/routes.ts), never the caller's x-request-id header.
        requestId: edgeIds.get(request) ?? randomUUID(),
        cookies: [],
        secure,
      };
      states.set(request, state);
    }
    return state;
  };

  // Who is calling is known early, for the hooks that answer per caller: the schema is hidden from anonymous
  // callers at execution (graphql/guards.ts), not in validation, whose results Yoga caches per document.
  const identifyEarly: Plugin = {
    onRequest({ request, serverContext }) {
      const id = requestIdFromEdge((serverContext as { req?: IncomingMessage }).req);
      if (id) edgeIds.set(request, id);
    },
    async onParams({ request }) {
      await stateOf(request);
    },
    onResponse({ request, response }) {
      const state = states.get(request);
      if (!state) return;
      response.headers.set('x-request-id', state.requestId);
      for (const c of state.cookies) response.headers.append('set-cookie', c);
    },
  };

  // "Did you mean …?" maps the schema for whoever asks; only callers who may read it get the hints. Done on the
  // way out rather than in validation, whose results Yoga caches per document, whoever sent it.
  const suggestionsForSignedInOnly: Plugin = {
    onResultProcess({ request, result, setResult }) {
      const viewer = states.get(request)?.viewer;
      if (viewer && viewer.kind !== 'anonymous') return;
      if (!result || Array.isArray(result) || !('errors' in result) || !result.errors) return;
      const errors = result.errors as readonly GraphQLError[];
      if (!errors.some((e) => / Did you mean /.test(e.message))) return;
      setResult({
        ...result,
        errors: errors.map((e) =>
          / Did you mean /.test(e.message)
            ? new GraphQLError(e.message.replace(/ Did you mean .*$/, ''), { nodes: e.nodes, extensions: e.extensions })
            : e,
        ),
      });
    },
  };

  // Refuse oversized bodies before they are read: the limit is a setting because uploads of data go elsewhere.
  const bodyLimit: Plugin = {
    onRequest({ request, endResponse, fetchAPI }) {
      if (request.method !== 'POST') return;
      const length = Number(request.headers.get('content-length') ?? Number.NaN);
      if (Number.isNaN(length) || length > config.maxBodyBytes) {
        const message = Number.isNaN(length)
          ? 'a POST to /graphql needs a Content-Length header'
          : `the request body is ${length} bytes; the limit is ${config.maxBodyBytes} (HANGAR_MAX_BODY_BYTES)`;
        endResponse(
          new fetchAPI.Response(JSON.stringify({ errors: [{ message, extensions: { code: 'BODY_TOO_LARGE' } }] }), {
            status: Number.isNaN(length) ? 411 : 413,
            headers: { 'content-type': 'application/json' },
          }),
        );
      }
    },
  };

  // GraphiQL is a page of this origin like the console: not to be framed by another site (clickjacking).
  const pageHeaders: Plugin = {
    onResponse({ response }) {
      if (!response.headers.get('content-type')?.startsWith('text/html')) {
        response.headers.set('x-content-type-options', 'nosniff');
        return;
      }
      for (const [name, value] of Object.entries(GRAPHIQL_HEADERS)) response.headers.set(name, value);
    },
  };

  const yoga = createYoga<Record<string, unknown>, Context>({
    schema,
    graphqlEndpoint: '/graphql',
    landingPage: false,
    // bodyLimit below refuses a POST without a Content-Length or over the limit before it is read, and Node's
    // parser never reads past a Content-Length. Yoga's own limit pipes every body through a counting stream to
    // find what those two already ensure: measured in bench/auth.ts, 40 % of the CPU of a small query.
    maxRequestBodySize: false,
    // Queries over GET: the session cookie alone identifies a GET (it carries no mutation), so a signed-in
    // operator's GraphiQL can read the schema, which is closed to anonymous callers.
    graphiql: config.graphiql
      ? { title: 'Hangar GraphQL', subscriptionsProtocol: 'WS', useGETForQueries: true }
      : false,
    // The console is served from this origin and needs no CORS. A page on another origin, even another port of
    // this host (cookies are not kept apart by port), gets no grant unless HANGAR_CORS_ORIGINS lists it, so a
    // browser neither sends its preflighted requests nor lets it read the answers.
    cors: (request) => {
      const origin = request.headers.get('origin');
      if (!origin || !config.corsOrigins.includes(origin)) return false;
      return {
        origin: [origin],
        credentials: true,
        methods: ['GET', 'POST'],
        allowedHeaders: ['content-type', 'authorization', CSRF_HEADER, 'x-request-id', 'accept'],
        exposedHeaders: ['x-request-id'],
        maxAge: 600,
      };
    },
    renderGraphiQL: graphiqlWithSession,
    logging: {
      debug: (...a) => log.debug(String(a[0]), { args: a.slice(1) }),
      info: (...a) => log.info(String(a[0]), { args: a.slice(1) }),
      warn: (...a) => log.warn(String(a[0]), { args: a.slice(1) }),
      // Yoga calls this with every error that maskError replaced. Ours are refusals the caller was told about
      // (not signed in, a revoked token, a role too low): a line at info without a stack, or an operator reading
      // the log at level error would find every anonymous probe there. Anything else maskError has already
      // logged at error with the request id the caller was given; Yoga's copy of it adds nothing.
      error: (...a) => {
        const ours = causeOf(a[0], isHangarError);
        if (ours) log.info('refused', { code: ours.code, reason: ours.message });
        else if (a[0] instanceof Error)
          log.debug('masked an unexpected error (logged above)', { message: a[0].message });
        else log.error(String(a[0]), { args: a.slice(1) });
      },
    },
    maskedErrors: {
      // Expected failures (ours, and GraphQL's own parse and validation errors) reach the caller as they are;
      // anything else is masked and logged with a request id the caller can quote.
      maskError: (error, message) => {
        const nodes = isGraphQLError(error) ? error.nodes : undefined;
        const path = isGraphQLError(error) ? error.path : undefined;
        const ours = causeOf(error, isHangarError);
        if (ours) return new GraphQLError(ours.message, { nodes, path, extensions: { code: ours.code } });
        if (isGraphQLError(error) && !error.originalError) return error;
        const requestId = randomUUID();
        log.error('unexpected error', { requestId, error: causeOf(error, (e) => !isGraphQLError(e)) ?? error });
        return new GraphQLError(message, { nodes, path, extensions: { code: 'INTERNAL', requestId } });
      },
    },
    plugins: [
      bodyLimit,
      pageHeaders,
      requestGuards,
      identifyEarly,
      liveSubscriptions(deps.live),
      shareSubscriptionResults({ pubsub: deps.pubsub, onResult: deps.onSubscriptionResult }),
      suggestionsForSignedInOnly,
      EnvelopArmorPlugin({
        maxDepth: { n: queryLimits.maxDepth },
        costLimit: { maxCost: queryLimits.maxCost },
        maxAliases: { n: queryLimits.maxAliases },
        maxTokens: { n: queryLimits.maxTokens },
        maxDirectives: { n: queryLimits.maxDirectives },
        // Handled above, per caller: armor's switch is all or nothing.
        blockFieldSuggestion: { enabled: false },
      }),
      compressAnswers(),
      // Queries run as JavaScript compiled once per document (graphql-jit), not walked field by field: the Mirror
      // page's query at 5000 versions is 150k fields, 250 ms walked and 100 ms compiled (bench/mirror-query.ts).
      // Not mutations and subscriptions: their per-event sharing (shared-results.ts) and audit hooks are written
      // against graphql-js' execution, and neither returns thousands of fields.
      useGraphQlJit(
        {},
        { enableIf: (args) => getOperationAST(args.document, args.operationName)?.operation === 'query' },
      ),
      ...(deps.metrics ? [graphqlMetrics(deps.metrics)] : []),
      ...(deps.tracing ? [deps.tracing.graphqlPlugin()] : []),
    ],
    context: async (initial): Promise<Context> => {
      // WebSocket operations arrive with their viewer already set (graphql/ws.ts); HTTP ones are looked up.
      const pre = initial as Partial<Context>;
      const state = pre.viewer ? undefined : await stateOf(initial.request);
      // Only what Hangar adds: Yoga merges it into the initial context (request, params, req, res) itself.
      const built = {
        prisma: deps.prisma,
        config,
        log,
        pubsub: deps.pubsub,
        services,
        viewer: pre.viewer ?? state?.viewer ?? { kind: 'anonymous' },
        requestId: pre.requestId ?? state?.requestId ?? randomUUID(),
        clientAddress:
          pre.clientAddress ??
          clientAddress(
            (initial as { req?: IncomingMessage }).req?.socket.remoteAddress,
            initial.request.headers.get('x-forwarded-for'),
            config.trustProxy,
          ),
        responseCookies: state?.cookies ?? [],
        secure: state?.secure ?? false,
      } as Context;
      // What the services get: who, under which request, from where; never the context itself.
      const { viewer, requestId, clientAddress: address } = built;
      const req = (initial as { req?: IncomingMessage }).req;
      built.actor = actorOf(viewer, {
        requestId,
        // The caller's own x-request-id, beside ours on the lines services write for it (auth/actor.ts logFor).
        clientRequestId: req ? clientRequestIdOf(req) : undefined,
        clientAddress: address,
        userAgent: initial.request.headers.get('user-agent'),
      });
      return built;
    },
  });
  return yoga;
}

/**
 * GraphiQL as Yoga renders it, with the console's session: a request that carries the session cookie must carry
 * its CSRF token as a header too (auth/auth.service.ts), and GraphiQL's own fetch sends none, so every mutation
 * from a signed-in operator was refused as anonymous. The token is read from its cookie at each request, as the
 * console does, so signing in again in another tab does not leave this page with a stale one. Requests that bring
 * their own header (an Authorization typed into the headers editor) are left as they are.
 */
async function graphiqlWithSession(options: GraphiQLOptions): Promise<string> {
  // Loaded at the first GraphiQL page, not at every start: the renderer alone is 0.25–0.4 s of module loading.
  const { renderGraphiQL } = await import('@graphql-yoga/render-graphiql');
  const page = renderGraphiQL(options);
  const session = `<script>
    (function () {
      var original = window.fetch.bind(window);
      window.fetch = function (input, init) {
        var url = new URL(typeof input === 'string' || input instanceof URL ? String(input) : input.url, location.href);
        var match = document.cookie.match(/(?:^|;\\s*)${CSRF_COOKIE}=([^;]+)/);
        if (url.origin !== location.origin || !match) return original(input, init);
        var headers = new Headers((init && init.headers) || (input instanceof Request ? input.headers : undefined));
        if (!headers.has('${CSRF_HEADER}')) headers.set('${CSRF_HEADER}', decodeURIComponent(match[1]));
        return original(input, Object.assign({}, init, { headers: headers, credentials: 'same-origin' }));
      };
    })();
  </script>`;
  return page.replace('<head>', `<head>${session}`);
}

// By name, not instanceof: graphql ships as both CommonJS and ESM, and libraries may hold either copy.
function isGraphQLError(e: unknown): e is GraphQLError {
  return e instanceof Error && e.name === 'GraphQLError';
}

/** The first error in a chain of originalError/cause links that matches. */
function causeOf<T>(error: unknown, match: (e: unknown) => e is T): T | undefined;
function causeOf(error: unknown, match: (e: unknown) => boolean): unknown;
function causeOf(error: unknown, match: (e: unknown) => boolean): unknown {
  let e: unknown = error;
  for (let depth = 0; e && depth < 8; depth++) {
    if (match(e)) return e;
    const next = e as { originalError?: unknown; cause?: unknown };
    e = next.originalError ?? next.cause;
  }
  return undefined;
}

export type HangarYoga = ReturnType<typeof buildYoga>;
