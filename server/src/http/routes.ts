import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type Logger, withFields } from '@hangar/common/log';
import { type Actor, actorOf } from '../auth/actor.js';
import type { Credentials } from '../auth/auth.service.js';
import { clientAddress } from '../auth/client-address.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Role } from '../generated/prisma/enums.js';
import { sendJson } from './reply.js';

// The HTTP edge's route table: each route says which credentials it reads and who may call it, and the edge does
// identify → authorize → handler the same way for all of them. The request id is made here, once: it is the
// x-request-id answered, the id on every log line of the request, and the id its audit rows carry, so one upload
// reads as one request wherever it is looked up. A caller's own x-request-id is never that id (see requestIdOf).

/** What the edge hands a handler: the request's id, a logger that writes it on every line, and the caller. */
export type Edge = {
  requestId: string;
  path: string;
  /** Writes the request's id on every line, and the caller's own x-request-id beside it when it sent one. */
  log: Logger;
  /** Identified once per request, from the credentials the route reads; later calls get the same answer. */
  viewer(): Promise<Viewer>;
  actor(): Promise<Actor>;
};

/** Why a caller is turned away: 401 when no credential stands, 403 when one does but may not do this. */
export type Refusal = { status: 401 | 403; message: string };

export type Route = {
  name: string;
  match(path: string, method: string): boolean;
  /** Which credentials this route reads (default: token, session cookie and CSRF header, as GraphQL reads them). */
  credentials?(req: IncomingMessage): Credentials;
  /**
   * Who may call, checked before the handler runs; absent, the handler decides, because its answer for a caller
   * it refuses must not come before the one for a path that does not exist (an owned job's data, the Hub's 404s).
   */
  authorize?(viewer: Viewer): Refusal | undefined;
  /** How a refusal is worded in this route's protocol (default: Hangar's JSON `{ error }`). */
  refuse?(res: ServerResponse, refusal: Refusal): void;
  /**
   * Audits a refusal of a caller who showed a credential (anonymous ones are not: anyone could add rows without
   * end). The route says what the refused call was, in the audit log's words.
   */
  auditRefusal?: { action: string; target(path: string): string | undefined };
  /**
   * false: the id is kept for the log and the audit rows but not answered as x-request-id. /v1 answers the
   * headers OpenAI's protocol had before the edge existed: its tests compare a hidden model's 404 with an
   * unknown one's, header for header, so that nothing tells them apart.
   */
  answersRequestId?: false;
  /** The route guards its own body (the gateway, to refuse a slow one in OpenAI's words), not the edge. */
  guardsOwnBody?: true;
  handle(req: IncomingMessage, res: ServerResponse, edge: Edge): Promise<unknown>;
};

export type EdgeDeps = {
  identify(credentials: Credentials): Promise<Viewer>;
  refused(actor: Actor, action: string, target: string | undefined, message: string): Promise<unknown>;
  log: Logger;
  /** Whether X-Forwarded-For names the client (HANGAR_TRUST_PROXY): what an Actor's address is taken from. */
  trustProxy: boolean;
};

/** The credentials as GraphQL and most routes read them: token, session cookie and its CSRF header. */
export function credentialsOf(
  req: IncomingMessage,
  o: { cookie?: boolean; csrf?: boolean; method?: string; authorization?: string | null } = {},
): Credentials {
  const header = (name: string) => {
    const v = req.headers[name];
    return typeof v === 'string' ? v : null;
  };
  return {
    authorization: o.authorization !== undefined ? o.authorization : header('authorization'),
    cookie: o.cookie === false ? null : header('cookie'),
    csrf: o.csrf === false ? null : header('x-hangar-csrf'),
    method: o.method ?? req.method ?? 'GET',
  };
}

/** The id Hangar gave each request the edge has opened: Yoga files the request's context under the same. */
const edgeRequestIds = new WeakMap<IncomingMessage, string>();

/**
 * The request id: always Hangar's own, never the caller's x-request-id. An id a caller chooses would let it file
 * its audit rows under another request's id (or under none a proxy ever made); what it sent is kept apart, as
 * clientRequestId (below). Remembered for the request, so GraphQL uses the same (requestIdFromEdge).
 */
export function requestIdOf(req: IncomingMessage): string {
  let id = edgeRequestIds.get(req);
  if (!id) {
    id = randomUUID();
    edgeRequestIds.set(req, id);
  }
  return id;
}

/** The id the edge gave this request, or undefined for one that did not come through it (an in-process call). */
export function requestIdFromEdge(req: IncomingMessage | undefined): string | undefined {
  return req ? edgeRequestIds.get(req) : undefined;
}

const CLIENT_REQUEST_ID_MAX = 64;

/**
 * The caller's own x-request-id (a proxy's, so its log and ours line up), for the log line only: cut to 64
 * characters, and anything but visible ASCII replaced by '?', so that a caller cannot write a line break, a
 * terminal escape or 10 KB into the log. Undefined when none was sent.
 */
export function clientRequestIdOf(req: IncomingMessage): string | undefined {
  const sent = req.headers['x-request-id'];
  if (typeof sent !== 'string' || !sent) return undefined;
  return sent.slice(0, CLIENT_REQUEST_ID_MAX).replace(/[^\x21-\x7e]/g, '?');
}

/** A rule: a user's session or API token with at least `role`; the words say what the caller was trying. */
export function needRole(
  role: Role,
  words: { anonymous: string; notAUser: string; tooLow(role: Role): string },
): (viewer: Viewer) => Refusal | undefined {
  return (viewer) => {
    if (viewer.kind === 'anonymous') return { status: 401, message: viewer.reason ?? words.anonymous };
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return { status: 403, message: words.notAUser };
    if (!roleAtLeast(viewer.role, role)) return { status: 403, message: words.tooLow(viewer.role) };
    return undefined;
  };
}

/** The edge itself: finds the route, gives it an id, a logger and its caller, authorizes, then hands it over. */
export function edgeFor(routes: Route[], deps: EdgeDeps) {
  return {
    /** The route for a request, or undefined when none is: the caller answers that (the console, a 404). */
    find: (path: string, method: string) => routes.find((r) => r.match(path, method)),
    /** Builds the request's Edge: its id (answered as x-request-id), logger and caller. */
    open(req: IncomingMessage, res: ServerResponse, path: string, route?: Route): Edge {
      const requestId = requestIdOf(req);
      const clientRequestId = clientRequestIdOf(req);
      if (route?.answersRequestId !== false && !res.headersSent) res.setHeader('x-request-id', requestId);
      let viewer: Promise<Viewer> | undefined;
      const identify = () => {
        viewer ??= deps.identify(route?.credentials?.(req) ?? credentialsOf(req));
        return viewer;
      };
      return {
        requestId,
        path,
        log: withFields(deps.log, clientRequestId ? { requestId, clientRequestId } : { requestId }),
        viewer: identify,
        actor: async () =>
          actorOf(await identify(), {
            requestId,
            clientRequestId,
            clientAddress: clientAddress(req.socket.remoteAddress, req.headers['x-forwarded-for'], deps.trustProxy),
            userAgent: req.headers['user-agent'] ?? null,
          }),
      };
    },
    async run(route: Route, req: IncomingMessage, res: ServerResponse, edge: Edge): Promise<void> {
      const started = Date.now();
      res.once('finish', () =>
        edge.log.debug('request', {
          route: route.name,
          method: req.method,
          path: edge.path,
          status: res.statusCode,
          ms: Date.now() - started,
        }),
      );
      if (route.authorize) {
        const viewer = await edge.viewer();
        const refusal = route.authorize(viewer);
        if (refusal) {
          if (route.auditRefusal && viewer.kind !== 'anonymous')
            await deps.refused(
              await edge.actor(),
              route.auditRefusal.action,
              route.auditRefusal.target(edge.path),
              refusal.message,
            );
          if (route.refuse) return route.refuse(res, refusal);
          return sendJson(res, refusal.status, { error: refusal.message });
        }
      }
      await route.handle(req, res, edge);
    },
  };
}
