import type { IncomingMessage } from 'node:http';
import type { Logger } from '@hangar/common/log';
import type { AuthService } from '../auth/auth.service.js';
import { CredentialCache, type CredentialEvents } from '../auth/credential-cache.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { LimitHold } from '../governance/limits-gate.js';
import type { OrgService, Reach, Sight } from '../org/org.service.js';
import { sees } from '../org/org.service.js';

// Who calls /v1, and whom they stand for. The first is AuthService's answer (kept briefly there, with expiry,
// CSRF and revocation checked on every request). The second costs database round-trips (the user's and the
// token's memberships), which an application making hundreds of requests a second should not pay on each: it is
// kept for a few seconds, and dropped at once when the 'credentials' event says something about that user
// changed (a membership added or removed, a token revoked, the user demoted or disabled), as live connections
// are (auth/live.ts). While this process hears no events (its LISTEN connection is down), nothing is kept.

export type Caller = {
  /** As the audit log records it (a wake, say). */
  viewer: Viewer;
  userId: string;
  /** The API token's id; '' for a console session (the playground). */
  tokenId: string;
  admin: boolean;
  reach: Reach;
  /** The HTTP edge's id for the request (http/routes.ts): what its audit rows (a wake) are filed under. */
  requestId?: string;
  /** What the request reserved under its limits (governance/limits-gate.ts): charged with what it delivered. */
  limit?: LimitHold;
  /** The edge's logger for the request (edge.log): the gateway's lines of it carry its id. */
  log?: Logger;
};

export type Identified = { ok: true; caller: Caller } | { ok: false; reason: string };

export class Callers {
  // The same rules as AuthService's cache of tokens and sessions (auth/credential-cache.ts), by (user, token).
  private readonly reaches = new CredentialCache<{ userId: string; reach: Reach }>((v) => ({
    userId: v.userId,
    expiresAt: null,
  }));

  constructor(
    private readonly deps: {
      auth: AuthService;
      org: OrgService;
      events: CredentialEvents;
    },
  ) {}

  start() {
    this.reaches.start(this.deps.events);
  }

  stop() {
    this.reaches.stop();
  }

  async identify(req: IncomingMessage): Promise<Identified> {
    // Who it is comes from AuthService every time: its own short cache keeps that cheap, and it alone checks
    // expiry, the CSRF header and revocation. What is kept here is whom the caller stands for (memberships).
    const viewer = await this.deps.auth.identify({
      authorization: req.headers.authorization ?? null,
      cookie: req.headers.cookie ?? null,
      csrf: (req.headers['x-hangar-csrf'] as string | undefined) ?? null,
      method: req.method ?? 'POST',
      purpose: 'call',
    });
    if (viewer.kind !== 'user' && viewer.kind !== 'token') {
      const reason =
        viewer.kind === 'anonymous'
          ? (viewer.reason ?? 'no API token: send Authorization: Bearer <an API token made on the Tokens page>')
          : 'a node token does not call models: use an API token';
      return { ok: false, reason };
    }
    const tokenId = viewer.kind === 'token' ? viewer.tokenId : '';
    const caller: Caller = {
      viewer,
      userId: viewer.user.id,
      tokenId,
      admin: roleAtLeast(viewer.role, 'ADMIN'),
      reach: await this.reachOf(viewer.user.id, tokenId),
    };
    return { ok: true, caller };
  }

  /**
   * What a viewer may see of owned things elsewhere (GraphQL), by the same rule and from the same kept reach as
   * what it may call here (OrgReads.sightOf), so a membership removed hides them at once on both.
   */
  sight(viewer: Viewer): Promise<Sight> {
    return this.deps.org.sightOf(viewer, (userId, tokenId) => this.reachOf(userId, tokenId ?? ''));
  }

  private async reachOf(userId: string, tokenId: string): Promise<Reach> {
    const kept = await this.reaches.get(`${userId}:${tokenId}`, async () => ({
      userId,
      reach: await this.deps.org.callerReach({ userId, tokenId: tokenId || undefined }),
    }));
    return kept.reach;
  }
}

/** Whether an owner key ("team:<id>", null for everyone) admits the caller (org-owners.ts `sees`). */
export function admits(caller: Caller, owner: string | null): boolean {
  return sees(caller, owner);
}
