import type { IncomingMessage } from 'node:http';
import type { AuthService } from '../auth/auth.service.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Logger } from '../lib/log.js';
import type { OrgService, Reach } from '../org/org.service.js';
import { parseOwnerKey } from '../org/org.service.js';
import type { PubSub } from '../pubsub.js';

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
  /** What the audit log calls it, as describeActor does. */
  label: string;
  admin: boolean;
  reach: Reach;
};

export type Identified = { ok: true; caller: Caller } | { ok: false; reason: string };

const KEEP_MS = 5000;
const MAX_KEPT = 10_000;

export class Callers {
  private readonly kept = new Map<string, { at: number; userId: string; reach: Reach }>();
  private readonly lookups = new Map<string, Promise<Reach>>();
  /** When each holder's credentials last changed (for KEEP_MS), so a lookup that straddled it is not kept. */
  private readonly changedAt = new Map<string, number>();
  private stopListening: (() => void) | undefined;

  constructor(
    private readonly deps: {
      auth: AuthService;
      org: OrgService;
      pubsub: PubSub;
      log: Logger;
      /** Whether this process hears the database's events now. */
      listening: () => boolean;
    },
  ) {}

  start() {
    const events = this.deps.pubsub.subscribe('credentials')[Symbol.asyncIterator]();
    this.stopListening = () => void events.return?.();
    void (async () => {
      for (;;) {
        const event = await events.next();
        if (event.done) return;
        const holder = event.value;
        const now = Date.now();
        this.changedAt.set(holder, now);
        for (const [h, at] of this.changedAt) if (now - at > KEEP_MS) this.changedAt.delete(h);
        for (const [key, entry] of this.kept) if (`user:${entry.userId}` === holder) this.kept.delete(key);
      }
    })().catch((err: unknown) => {
      this.deps.log.error('gateway: stopped hearing credentials changes; callers are checked on every request', {
        error: err,
      });
      this.stopListening = undefined;
    });
  }

  stop() {
    this.stopListening?.();
    this.stopListening = undefined;
    this.kept.clear();
  }

  /** The caller of a /v1 request: an API token (any, caller-only included), or a console session with its CSRF header. */
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
      label: viewer.kind === 'token' ? `token:${viewer.tokenName} (${viewer.user.email})` : `user:${viewer.user.email}`,
      admin: roleAtLeast(viewer.role, 'ADMIN'),
      reach: await this.reachOf(viewer.user.id, tokenId),
    };
    return { ok: true, caller };
  }

  private reachOf(userId: string, tokenId: string): Promise<Reach> {
    const lookUp = () => this.deps.org.callerReach({ userId, tokenId: tokenId || undefined });
    if (!this.stopListening || !this.deps.listening()) return lookUp();
    const key = `${userId}:${tokenId}`;
    const hit = this.kept.get(key);
    if (hit && Date.now() - hit.at < KEEP_MS) return Promise.resolve(hit.reach);
    // A burst of requests whose entry just ran out makes one lookup, not one each.
    let pending = this.lookups.get(key);
    if (!pending) {
      const startedAt = Date.now();
      pending = lookUp()
        .then((reach) => {
          // Not kept when the user's credentials changed while it was being looked up: it may predate the change.
          if ((this.changedAt.get(`user:${userId}`) ?? 0) < startedAt) {
            if (this.kept.size >= MAX_KEPT) this.kept.clear();
            this.kept.set(key, { at: Date.now(), userId, reach });
          }
          return reach;
        })
        .finally(() => this.lookups.delete(key));
      this.lookups.set(key, pending);
    }
    return pending;
  }
}

/** Whether an owner key ("team:<id>", null for everyone) admits the caller. Admins call everything. */
export function admits(caller: Caller, owner: string | null): boolean {
  if (owner === null || caller.admin) return true;
  const parsed = parseOwnerKey(owner);
  return parsed ? caller.reach[parsed.scope].has(parsed.id) : false;
}
