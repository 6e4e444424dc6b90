import { type Logger, withFields } from '@hangar/common/log';
import type { Viewer } from './viewer.js';

/**
 * Who asks a service to do something, and under which request: what services take instead of the GraphQL
 * context, so they know nothing of GraphQL, HTTP, cookies or headers. The edge (graphql/yoga.ts, graphql/ws.ts,
 * the HTTP routes) builds one per request from what it identified; Hangar acting on its own (a serve job's
 * steps, startup) uses systemActor. The audit log records `describeActor(actor)` and the request id.
 */
export type Actor = {
  viewer: Viewer;
  /** Ties the audit rows and log lines of one request together. */
  requestId: string;
  /** The caller's own x-request-id (http/routes.ts clientRequestIdOf), for log lines only: never on audit rows. */
  clientRequestId?: string;
  /**
   * The client's address, as the edge worked it out (auth/client-address.ts): what sign-in attempts are counted
   * against. Undefined for requests made in-process and for the system.
   */
  clientAddress?: string;
  /** The browser's User-Agent, kept with a new session so the account page can tell sessions apart. */
  userAgent?: string;
};

// Longer agents are cut: a header is the caller's to fill, a session row is not theirs to grow.
const USER_AGENT_MAX = 300;

/** The actor of a request the edge identified: the viewer, the edge's request id, and what the client sent. */
export function actorOf(
  viewer: Viewer,
  request: { requestId: string; clientRequestId?: string; clientAddress?: string; userAgent?: string | null },
): Actor {
  const actor: Actor = { viewer, requestId: request.requestId };
  if (request.clientRequestId) actor.clientRequestId = request.clientRequestId;
  if (request.clientAddress) actor.clientAddress = request.clientAddress;
  if (request.userAgent) actor.userAgent = request.userAgent.slice(0, USER_AGENT_MAX);
  return actor;
}

/**
 * Hangar acting on its own ("serve-job", "startup"): audited as `system:<name>`. Give the request id of the
 * request that set it going, where there is one, so its rows read together; otherwise one is made from the name.
 */
export function systemActor(name: string, requestId?: string): Actor {
  return { viewer: { kind: 'system', name }, requestId: requestId ?? `${name}-${Date.now().toString(36)}` };
}

/**
 * The logger a service writes with when it acts for `actor`: every line carries the actor's request id (the one
 * answered as x-request-id and on its audit rows) and the caller's own id beside it, so an operator finds a
 * request's service lines by the id the caller was given. Made where a line is written, not per request.
 */
export function logFor(log: Logger, actor: Pick<Actor, 'requestId' | 'clientRequestId'>): Logger {
  return withFields(
    log,
    actor.clientRequestId
      ? { requestId: actor.requestId, clientRequestId: actor.clientRequestId }
      : { requestId: actor.requestId },
  );
}

/** The actor as the audit log names it: the one description, used by the audit log and the gateway alike. */
export function describeActor(actor: Pick<Actor, 'viewer'>): string {
  const viewer = actor.viewer;
  switch (viewer.kind) {
    case 'user':
      return `user:${viewer.user.email}`;
    case 'token':
      return `token:${viewer.tokenName} (${viewer.user.email})`;
    case 'node':
      return `node:${viewer.node.name}`;
    case 'system':
      return `system:${viewer.name}`;
    default:
      return 'anonymous';
  }
}
