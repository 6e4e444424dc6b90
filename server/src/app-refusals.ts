import type http from 'node:http';
import type { Duplex } from 'node:stream';
import type { AuditService } from './audit/audit.service.js';
import { actorOf } from './auth/actor.js';
import type { AuthService } from './auth/auth.service.js';
import { sendJson } from './http/reply.js';
import { credentialsOf, type Edge } from './http/routes.js';

// What the server's front door refuses before any route answers (app.ts): a URL with a NUL in it, a path under
// an API's prefix that nothing serves, a WebSocket upgrade it does not take.

// A NUL in a URL is refused before any route: PostgreSQL cannot store it, and a lookup with it would fail as
// an unexpected error. A refused change by a caller who showed a credential is audited, as any refusal is;
// anonymous ones are not, or anyone could add rows without end.
export function nulRefusal(auth: AuthService, audit: AuditService) {
  return async (req: http.IncomingMessage, res: http.ServerResponse, edge: Edge) => {
    const path = edge.path;
    const error = 'a NUL byte (%00) is not accepted in a URL: no name, id or cursor in Hangar holds one';
    if (req.method !== 'GET' && req.method !== 'HEAD' && req.method !== 'OPTIONS') {
      // By the full credentials and the real method, whatever the path's route reads: a session cookie counts
      // only with its CSRF header here too, or another site's page could file refusals in a user's name.
      const viewer = await auth.identify(credentialsOf(req));
      const actor = actorOf(viewer, { requestId: edge.requestId });
      const action = path.startsWith('/mirror/')
        ? 'uploadToMirror'
        : path === '/api/train/data'
          ? 'uploadTrainData'
          : path.startsWith('/api/train/')
            ? 'uploadTrainArtifact'
            : `${req.method} ${path.split('/')[1] ?? ''}`;
      // The path as sent, still percent-encoded: the audit log holds text, and %00 is text.
      if (viewer.kind !== 'anonymous') {
        await audit.refused(actor, action, path.replaceAll('\u0000', '%00'), error);
      }
    }
    res.setHeader('connection', 'close');
    return sendJson(res, 400, { error, code: 'VALIDATION' });
  };
}

/** A path under an API's prefix that no route serves: a 404 a script can read, never the console's page. */
export function notServed(res: http.ServerResponse, path: string) {
  sendJson(res, 404, {
    error: `nothing is served at ${path}: the APIs are /graphql, /v1 (OpenAI's), /mirror/<model>/<version>/<file>, /hf (the Hub's protocol) and /api/train/; see README.md`,
    code: 'NOT_FOUND',
  });
}

export function refuseUpgrade(socket: Duplex, status: number, text: string) {
  socket.end(`HTTP/1.1 ${status} ${text}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
}
