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
  request: { requestId: string; clientAddress?: string; userAgent?: string | null },
): Actor {
  const actor: Actor = { viewer, requestId: request.requestId };
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
