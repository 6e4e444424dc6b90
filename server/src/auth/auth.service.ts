import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import type { Db } from '../db/client.js';
import { fail, ok, type Result, UnauthenticatedError, type ValidationError } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { parseInput } from '../lib/validate.js';
import { CSRF_COOKIE, CSRF_HEADER, parseCookies, SESSION_COOKIE, serializeCookie } from './cookies.js';
import { hashPassword, hashSecret, newSecret, sameSecret, secretKind, verifyPassword } from './secrets.js';
import type { Viewer, ViewerUser } from './viewer.js';

const loginInput = z.object({
  email: z.string().trim().toLowerCase().email('an email address'),
  password: z.string().min(1, 'the password is empty').max(1024, 'at most 1024 characters'),
});

// Compared against when the email is unknown, so a wrong email takes as long as a wrong password and the
// timing does not tell an attacker which accounts exist.
const decoyHash = hashPassword('decoy password that matches nothing');

// A token's last-used time is written at most this often: a script polling every second should not turn
// every read into a write.
const LAST_USED_RESOLUTION_MS = 60_000;

const FIRST_ADMIN_LOCK = 0x61646d6e; // 'admn'

export type Credentials = {
  authorization?: string | null;
  cookie?: string | null;
  csrf?: string | null;
  method: string;
};

export class AuthService {
  constructor(
    private readonly db: Db,
    private readonly config: Config,
    private readonly audit: AuditService,
    private readonly log: Logger,
  ) {}

  /** Who sent a request: an API or node token (Authorization: Bearer), or the console's session cookie. */
  async identify(c: Credentials): Promise<Viewer> {
    const bearer = c.authorization?.match(/^Bearer\s+(\S+)\s*$/i)?.[1];
    if (c.authorization && !bearer) {
      return { kind: 'anonymous', reason: 'the Authorization header is not "Bearer <token>"' };
    }
    if (bearer) return this.identifyToken(bearer);
    const session = parseCookies(c.cookie).get(SESSION_COOKIE);
    if (session) return this.identifySession(session, c);
    return { kind: 'anonymous' };
  }

  private async identifyToken(secret: string): Promise<Viewer> {
    const kind = secretKind(secret);
    const tokenHash = hashSecret(secret);
    if (kind === 'node') {
      const node = await this.db.node.findUnique({ where: { tokenHash }, select: { id: true, name: true } });
      return node
        ? { kind: 'node', node }
        : { kind: 'anonymous', reason: 'this node token is not known (the node was removed?)' };
    }
    if (kind !== 'api') {
      return { kind: 'anonymous', reason: 'not a Hangar token: API tokens start with hgr_, node tokens with hgn_' };
    }
    const token = await this.db.apiToken.findUnique({ where: { tokenHash }, include: { user: true } });
    if (!token) return { kind: 'anonymous', reason: 'this API token is not known' };
    if (token.revokedAt) {
      return {
        kind: 'anonymous',
        reason: `the API token "${token.name}" was revoked on ${token.revokedAt.toISOString()}`,
      };
    }
    if (token.expiresAt && token.expiresAt <= new Date()) {
      return { kind: 'anonymous', reason: `the API token "${token.name}" expired on ${token.expiresAt.toISOString()}` };
    }
    if (token.user.disabledAt) {
      return { kind: 'anonymous', reason: `the API token "${token.name}" belongs to a disabled user` };
    }
    const now = Date.now();
    if (!token.lastUsedAt || now - token.lastUsedAt.getTime() > LAST_USED_RESOLUTION_MS) {
      await this.db.apiToken.update({ where: { id: token.id }, data: { lastUsedAt: new Date(now) } });
    }
    return {
      kind: 'token',
      user: toViewerUser(token.user),
      role: token.role,
      tokenId: token.id,
      tokenName: token.name,
    };
  }

  private async identifySession(secret: string, c: Credentials): Promise<Viewer> {
    const session = await this.db.session.findUnique({
      where: { tokenHash: hashSecret(secret) },
      include: { user: true },
    });
    if (!session || session.expiresAt <= new Date()) {
      return { kind: 'anonymous', reason: 'the session has ended: sign in again' };
    }
    if (session.user.disabledAt) return { kind: 'anonymous', reason: 'this user is disabled' };
    // A cookie travels with any request the browser makes, including one forged by another site; the CSRF
    // header proves the request came from the console itself. GET carries no mutation (Yoga refuses them).
    if (c.method !== 'GET' && !(c.csrf && sameSecret(c.csrf, session.csrfToken))) {
      return {
        kind: 'anonymous',
        reason: `the session cookie came without its CSRF token: send the ${CSRF_COOKIE} cookie's value as the ${CSRF_HEADER} header`,
      };
    }
    return { kind: 'user', user: toViewerUser(session.user), role: session.user.role, sessionId: session.id };
  }

  async login(
    ctx: Context,
    input: unknown,
  ): Promise<Result<{ user: ViewerUser; csrfToken: string }, ValidationError | UnauthenticatedError>> {
    const parsed = parseInput(loginInput, input, '');
    if (!parsed.ok) return parsed;
    const { email, password } = parsed.value;
    const user = await this.db.user.findUnique({ where: { email } });
    const good = await verifyPassword(user?.passwordHash ?? (await decoyHash), password);
    if (!user || !good) return fail(new UnauthenticatedError('wrong email or password'));
    if (user.disabledAt) return fail(new UnauthenticatedError('this user is disabled: ask an admin'));
    const secret = newSecret('session');
    const csrfToken = newSecret('session');
    const maxAgeSeconds = this.config.sessionHours * 3600;
    const viewerUser = toViewerUser(user);
    await this.db.$transaction(async (tx) => {
      const session = await tx.session.create({
        data: {
          tokenHash: hashSecret(secret),
          csrfToken,
          userId: user.id,
          expiresAt: new Date(Date.now() + maxAgeSeconds * 1000),
          userAgent: ctx.request.headers.get('user-agent')?.slice(0, 300) ?? null,
        },
      });
      const caller = {
        requestId: ctx.requestId,
        viewer: { kind: 'user', user: viewerUser, role: user.role, sessionId: session.id } as const,
      };
      await this.audit.done(tx, caller, { action: 'login', target: user.email, message: 'signed in to the console' });
    });
    ctx.responseCookies.push(
      serializeCookie(SESSION_COOKIE, secret, { httpOnly: true, secure: ctx.secure, maxAgeSeconds }),
      serializeCookie(CSRF_COOKIE, csrfToken, { httpOnly: false, secure: ctx.secure, maxAgeSeconds }),
    );
    return ok({ user: viewerUser, csrfToken });
  }

  async logout(ctx: Context): Promise<Result<boolean>> {
    if (ctx.viewer.kind !== 'user') {
      return fail(
        new UnauthenticatedError('logout ends a console session; API tokens are revoked with revokeApiToken'),
      );
    }
    const { sessionId, user } = ctx.viewer;
    await this.db.$transaction(async (tx) => {
      await tx.session.delete({ where: { id: sessionId } });
      await this.audit.done(tx, ctx, { action: 'logout', target: user.email });
    });
    ctx.responseCookies.push(
      serializeCookie(SESSION_COOKIE, '', { httpOnly: true, secure: ctx.secure, maxAgeSeconds: 0 }),
      serializeCookie(CSRF_COOKIE, '', { httpOnly: false, secure: ctx.secure, maxAgeSeconds: 0 }),
    );
    return ok(true);
  }

  /**
   * With no user at all, the first admin comes from HANGAR_ADMIN_EMAIL / HANGAR_ADMIN_PASSWORD, or gets a
   * generated password printed once: a fresh install must be usable without editing a database by hand.
   */
  async ensureFirstAdmin(print: (text: string) => void): Promise<void> {
    if ((await this.db.user.count()) > 0) return;
    const email = (this.config.adminEmail ?? 'admin@hangar.local').toLowerCase();
    const generated = !this.config.adminPassword;
    const password = this.config.adminPassword ?? newSecret('session').slice(0, 20);
    const passwordHash = await hashPassword(password);
    const created = await this.db.$transaction(async (tx) => {
      // Two replicas starting on an empty database: the lock lets one create the admin; the other finds it.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${FIRST_ADMIN_LOCK})`;
      if ((await tx.user.count()) > 0) return false;
      await tx.user.create({ data: { email, name: 'Administrator', role: 'ADMIN', passwordHash } });
      const how = generated
        ? 'created with a generated password'
        : 'created from HANGAR_ADMIN_EMAIL / HANGAR_ADMIN_PASSWORD';
      const startup = { requestId: 'startup', viewer: { kind: 'anonymous' } as const };
      await this.audit.done(tx, startup, { action: 'createFirstAdmin', target: email, message: how });
      return true;
    });
    if (!created) return;
    this.log.info('created the first admin', { email });
    if (generated) {
      print(
        `\n  Hangar created its first admin.\n    email:    ${email}\n    password: ${password}\n  This is shown once. Sign in and change it, or set HANGAR_ADMIN_PASSWORD before the first start.\n`,
      );
    }
  }
}

export function toViewerUser(u: { id: string; email: string; name: string; role: ViewerUser['role'] }): ViewerUser {
  return { id: u.id, email: u.email, name: u.name, role: u.role };
}
