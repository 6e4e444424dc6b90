import type { Logger } from '@hangar/common/log';
import * as accessStore from '../access/access-store.js';
import type { AuditService } from '../audit/audit.service.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { nodeByTokenHash } from '../fleet/fleet-store.js';
import {
  ForbiddenError,
  fail,
  type HangarError,
  ok,
  type Result,
  TooManyAttemptsError,
  UnauthenticatedError,
  ValidationError,
} from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import type { Actor } from './actor.js';
import { CSRF_COOKIE, CSRF_HEADER, parseCookies, SESSION_COOKIE } from './cookies.js';
import { CredentialCache, type CredentialEvents } from './credential-cache.js';
import {
  type Credentials,
  changePasswordInput,
  loginInput,
  type OpenedSession,
  type SessionFound,
  type TokenFound,
  toViewerUser,
} from './credentials.js';
import type { LoginLimits } from './login-limits.js';
import { hashPassword, hashSecret, newSecret, sameSecret, secretKind, verifyPassword } from './secrets.js';
import { endSessions } from './sessions.js';
import { lowerRole, type Viewer, type ViewerUser } from './viewer.js';

// Compared against when the email is unknown, so a wrong email takes as long as a wrong password and the
// timing does not tell an attacker which accounts exist.
const decoyHash = hashPassword('decoy password that matches nothing');

// A token's last-used time is written at most this often: a script polling every second should not turn
// every read into a write.
const LAST_USED_RESOLUTION_MS = 60_000;

const FIRST_ADMIN_LOCK = 0x61646d6e; // 'admn'

// Refused sign-ins of one kind, account and address share an audit row for this long.
const AUDIT_WINDOW_MS = 15 * 60_000;

// The credential shapes and toViewerUser live in credentials.ts; re-exported so importers keep this path.
export { type Credentials, type OpenedSession, toViewerUser } from './credentials.js';

export class AuthService {
  private readonly tokens = new CredentialCache<TokenFound>((f) =>
    f.ok ? { userId: f.user.id, expiresAt: f.token.expiresAt } : undefined,
  );
  private readonly sessions = new CredentialCache<SessionFound>((f) =>
    f.ok ? { userId: f.user.id, expiresAt: f.expiresAt } : undefined,
  );

  constructor(
    private readonly db: Db,
    private readonly config: Config,
    private readonly audit: AuditService,
    private readonly log: Logger,
    private readonly limits: LoginLimits,
  ) {}

  /**
   * Keeps identified tokens and sessions for a few seconds from now on, dropping them as the 'credentials'
   * events say (auth/credential-cache.ts). Called once the process listens for the database's events.
   */
  keepCredentials(events: CredentialEvents): void {
    this.tokens.start(events);
    this.sessions.start(events);
  }

  stopKeepingCredentials(): void {
    this.tokens.stop();
    this.sessions.stop();
  }

  /** Who sent a request: an API or node token (Authorization: Bearer), or the console's session cookie. */
  async identify(c: Credentials): Promise<Viewer> {
    const bearer = c.authorization?.match(/^Bearer\s+(\S+)\s*$/i)?.[1];
    if (c.authorization && !bearer) {
      return { kind: 'anonymous', reason: 'the Authorization header is not "Bearer <token>"' };
    }
    if (bearer) return this.identifyToken(bearer, c.purpose ?? 'control', c.fresh ?? false);
    const session = parseCookies(c.cookie).get(SESSION_COOKIE);
    if (session) return this.identifySession(session, c);
    return { kind: 'anonymous' };
  }

  private async identifyToken(secret: string, purpose: 'control' | 'call', fresh: boolean): Promise<Viewer> {
    const kind = secretKind(secret);
    const tokenHash = hashSecret(secret);
    if (kind === 'node') {
      const node = await nodeByTokenHash(this.db, tokenHash);
      return node
        ? { kind: 'node', node }
        : { kind: 'anonymous', reason: 'this node token is not known (the node was removed?)' };
    }
    if (kind !== 'api') {
      return { kind: 'anonymous', reason: 'not a Hangar token: API tokens start with hgr_, node tokens with hgn_' };
    }
    const found = await this.tokens.get(tokenHash, () => this.findToken(tokenHash), fresh);
    if (!found.ok) return found.viewer;
    const { token, user } = found;
    // Checked on every request, kept or not: a kept token must not outlive its expiry by a moment.
    if (token.expiresAt && token.expiresAt <= new Date()) {
      return { kind: 'anonymous', reason: `the API token "${token.name}" expired on ${token.expiresAt.toISOString()}` };
    }
    if (token.callerOnly && purpose !== 'call') {
      return {
        kind: 'anonymous',
        reason: `the API token "${token.name}" is a caller token: it calls models at /v1 and nothing else`,
      };
    }
    return {
      kind: 'token',
      user: toViewerUser(user),
      // A token made by an admin who has since been demoted carries the user's role now, not the one it was
      // made with: otherwise a demotion would leave every earlier token as a way back up.
      role: lowerRole(token.role, user.role),
      tokenId: token.id,
      tokenName: token.name,
      callerOnly: token.callerOnly,
      batch: token.batch,
    };
  }

  private async findToken(tokenHash: string): Promise<TokenFound> {
    const token = await accessStore.tokenByHash(this.db, tokenHash);
    if (!token) return { ok: false, viewer: { kind: 'anonymous', reason: 'this API token is not known' } };
    const refused = (reason: string): TokenFound => ({ ok: false, viewer: { kind: 'anonymous', reason } });
    if (token.revokedAt) {
      return refused(`the API token "${token.name}" was revoked on ${token.revokedAt.toISOString()}`);
    }
    if (token.expiresAt && token.expiresAt <= new Date()) {
      return refused(`the API token "${token.name}" expired on ${token.expiresAt.toISOString()}`);
    }
    if (token.user.disabledAt) return refused(`the API token "${token.name}" belongs to a disabled user`);
    // Written only when the token is looked up, not on a kept answer: the time is coarse anyway.
    const now = Date.now();
    if (!token.lastUsedAt || now - token.lastUsedAt.getTime() > LAST_USED_RESOLUTION_MS) {
      await accessStore.touchToken(this.db, token.id, new Date(now));
    }
    const { id, name, role, callerOnly, batch, expiresAt } = token;
    return { ok: true, user: toViewerUser(token.user), token: { id, name, role, callerOnly, batch, expiresAt } };
  }

  private async identifySession(secret: string, c: Credentials): Promise<Viewer> {
    const tokenHash = hashSecret(secret);
    const session = await this.sessions.get(tokenHash, () => this.findSession(tokenHash), c.fresh ?? false);
    if (!session.ok) return session.viewer;
    if (session.expiresAt <= new Date()) {
      return { kind: 'anonymous', reason: 'the session has ended: sign in again' };
    }
    // A cookie travels with any request the browser makes, including one forged by another site; the CSRF
    // header proves the request came from the console itself. GET carries no mutation (Yoga refuses them).
    if (c.method !== 'GET' && !(c.csrf && sameSecret(c.csrf, session.csrfToken))) {
      return {
        kind: 'anonymous',
        reason: `the session cookie came without its CSRF token: send the ${CSRF_COOKIE} cookie's value as the ${CSRF_HEADER} header`,
      };
    }
    return { kind: 'user', user: toViewerUser(session.user), role: session.user.role, sessionId: session.sessionId };
  }

  private async findSession(tokenHash: string): Promise<SessionFound> {
    const session = await this.db.session.findUnique({ where: { tokenHash }, include: { user: true } });
    if (!session || session.expiresAt <= new Date()) {
      return { ok: false, viewer: { kind: 'anonymous', reason: 'the session has ended: sign in again' } };
    }
    if (session.user.disabledAt) return { ok: false, viewer: { kind: 'anonymous', reason: 'this user is disabled' } };
    const { id: sessionId, csrfToken, expiresAt } = session;
    return { ok: true, user: toViewerUser(session.user), sessionId, csrfToken, expiresAt };
  }

  /**
   * Signs in with a password. `crossSite` is the edge's reason to refuse a request that came from another
   * site's page (auth/origin.ts reads that from the request's headers); it is refused and audited here like any
   * other refused sign-in. What to hand the browser comes back as `session`: setting it is the edge's work.
   */
  async login(
    actor: Actor,
    input: { email: string; password: string },
    crossSite?: string,
  ): Promise<
    Result<
      { user: ViewerUser; csrfToken: string; session: OpenedSession },
      ValidationError | UnauthenticatedError | ForbiddenError | TooManyAttemptsError
    >
  > {
    const address = actor.clientAddress;
    const from = address ?? 'in-process';
    if (crossSite) return this.refuseLogin(actor, new ForbiddenError(crossSite), `cross-site:${from}`, undefined, from);
    const parsed = parseInput(loginInput, input, '');
    if (!parsed.ok) return this.refuseLogin(actor, parsed.error, `invalid:${from}`, undefined, from);
    const { email, password } = parsed.value;
    const account = hashSecret(email).slice(0, 32);
    const guessKey = `account:${account}:${from}`;
    // Counted before the password is checked (and the same for unknown emails), so the answer tells a guesser
    // neither whether the account exists nor anything a burst of parallel guesses could slip past.
    const verdict = await this.limits.attempt({ email, address });
    if (!verdict.ok) {
      const wait = verdict.retryAfterSeconds;
      const when = wait >= 90 ? `${Math.ceil(wait / 60)} minutes` : `${wait} seconds`;
      // Each kind of refusal is recorded under what it counted, so a guesser refused for the address gets one
      // row however many different emails they try.
      const { what, key, target } = {
        accountAddress: { what: `too many refused sign-ins for ${email} from ${from}`, key: guessKey, target: email },
        address: {
          what: `too many refused sign-ins from ${from}, for any account`,
          key: `address:${from}`,
          target: undefined,
        },
        account: {
          what: `too many refused sign-ins for ${email}, from many addresses`,
          key: `account:${account}:any`,
          target: email,
        },
      }[verdict.which];
      return this.refuseLogin(
        actor,
        new TooManyAttemptsError(`${what}: try again in ${when}, or ask an admin to reset the password`, wait),
        key,
        target,
        verdict.which === 'account' ? 'many addresses' : from,
      );
    }
    const user = await accessStore.userByEmail(this.db, email);
    const good = await verifyPassword(user?.passwordHash ?? (await decoyHash), password);
    if (!user || !good) {
      return this.refuseLogin(actor, new UnauthenticatedError('wrong email or password'), guessKey, email, from);
    }
    if (user.disabledAt) {
      return this.refuseLogin(
        actor,
        new UnauthenticatedError('this user is disabled: ask an admin'),
        guessKey,
        email,
        from,
      );
    }
    await verdict.succeeded();
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
          userAgent: actor.userAgent ?? null,
        },
      });
      // Recorded as the user now signed in, not as the anonymous caller who asked.
      const signedIn: Actor = {
        ...actor,
        viewer: { kind: 'user', user: viewerUser, role: user.role, sessionId: session.id },
      };
      await this.audit.done(tx, signedIn, { action: 'login', target: user.email, message: 'signed in to the console' });
    });
    return ok({ user: viewerUser, csrfToken, session: { secret, csrfToken, maxAgeSeconds } });
  }

  /**
   * A refused sign-in, recorded in one audit row per kind of refusal, account, address and quarter hour (the
   * row counts them): an anonymous caller can send these without end, and each one a row would let them fill
   * the log and bury what matters in it.
   */
  private async refuseLogin<E extends HangarError>(
    actor: Actor,
    error: E,
    key: string,
    target: string | undefined,
    from: string,
  ): Promise<{ ok: false; error: E }> {
    const start = Math.floor(Date.now() / AUDIT_WINDOW_MS) * AUDIT_WINDOW_MS;
    const since = new Date(start).toISOString().slice(11, 16);
    await this.audit.refusedRepeated(
      actor,
      {
        action: 'login',
        target,
        message: `${error.message} ({n} refused like this from ${from} in the quarter hour from ${since} UTC)`,
      },
      `login:${key}:${start}`,
    );
    error.recorded = true;
    return fail(error);
  }

  /** Ends the caller's console session; the edge clears the browser's cookies once this answers ok. */
  async logout(actor: Actor): Promise<Result<boolean>> {
    if (actor.viewer.kind !== 'user') {
      return fail(
        new UnauthenticatedError('logout ends a console session; API tokens are revoked with revokeApiToken'),
      );
    }
    const { sessionId, user } = actor.viewer;
    await this.db.$transaction(async (tx) => {
      await tx.session.delete({ where: { id: sessionId } });
      // The console's live views of this session (its WebSocket, any SSE stream) end on commit.
      await notify(tx, 'credentials', `user:${user.id}`);
      await this.audit.done(tx, actor, { action: 'logout', target: user.email });
    });
    return ok(true);
  }

  /**
   * The caller's own password, given the current one: a session left open on a shared machine must not be enough
   * to take the account. Every other session of the user ends (the point of changing a password is often that
   * someone else knows it), and live views opened with them end on commit; the session that asked stays signed
   * in. Wrong current passwords count against the same limits as sign-ins, or this would be a way around them.
   */
  async changePassword(
    actor: Actor,
    input: { currentPassword: string; newPassword: string },
  ): Promise<Result<{ signedOut: number }, ValidationError | UnauthenticatedError | TooManyAttemptsError>> {
    const parsed = parseInput(changePasswordInput, input);
    if (!parsed.ok) return parsed;
    const viewer = actor.viewer;
    if (viewer.kind !== 'user' && viewer.kind !== 'token') {
      return fail(new UnauthenticatedError('sign in to change your password'));
    }
    const { currentPassword, newPassword } = parsed.value;
    const verdict = await this.limits.attempt({ email: viewer.user.email, address: actor.clientAddress });
    // Refusals are audited by the schema's audit plugin, as every mutation's are.
    if (!verdict.ok) {
      return fail(
        new TooManyAttemptsError(
          `too many wrong passwords for ${viewer.user.email}: try again in ${verdict.retryAfterSeconds} seconds, or ask an admin to reset it`,
          verdict.retryAfterSeconds,
        ),
      );
    }
    const user = await accessStore.userById(this.db, viewer.user.id);
    if (!user || !(await verifyPassword(user.passwordHash, currentPassword))) {
      return fail(
        new ValidationError('input.currentPassword', 'input.currentPassword: this is not your current password'),
      );
    }
    if (newPassword === currentPassword) {
      return fail(
        new ValidationError('input.newPassword', 'input.newPassword: the same as the current one; choose another'),
      );
    }
    await verdict.succeeded();
    const passwordHash = await hashPassword(newPassword);
    const keep = viewer.kind === 'user' ? viewer.sessionId : undefined;
    const signedOut = await this.db.$transaction(async (tx) => {
      await accessStore.setPassword(tx, user.id, passwordHash);
      const ended = await endSessions(tx, user.id, keep);
      // Live subscriptions of the ended sessions are checked again on commit, and end; this session's go on.
      await notify(tx, 'credentials', `user:${user.id}`);
      await this.audit.done(tx, actor, {
        action: 'changePassword',
        target: user.email,
        message: `changed their own password; ${ended} other session${ended === 1 ? '' : 's'} signed out`,
      });
      return ended;
    });
    return ok({ signedOut });
  }

  /**
   * With no user at all, the first admin comes from HANGAR_ADMIN_EMAIL / HANGAR_ADMIN_PASSWORD, or gets a
   * generated password printed once: a fresh install must be usable without editing a database by hand.
   */
  async ensureFirstAdmin(print: (text: string) => void): Promise<void> {
    if ((await accessStore.userCount(this.db)) > 0) return;
    const email = (this.config.adminEmail ?? 'admin@hangar.local').toLowerCase();
    const generated = !this.config.adminPassword;
    const password = this.config.adminPassword ?? newSecret('session').slice(0, 20);
    const passwordHash = await hashPassword(password);
    const created = await this.db.$transaction(async (tx) => {
      // Two replicas starting on an empty database: the lock lets one create the admin; the other finds it.
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${FIRST_ADMIN_LOCK})`;
      if ((await accessStore.userCount(tx)) > 0) return false;
      await accessStore.createFirstAdmin(tx, email, passwordHash);
      const how = generated
        ? 'created with a generated password'
        : 'created from HANGAR_ADMIN_EMAIL / HANGAR_ADMIN_PASSWORD';
      // Nobody asked for it: the row names no one (anonymous), under the request id 'startup'.
      const startup: Actor = { requestId: 'startup', viewer: { kind: 'anonymous' } };
      await this.audit.done(tx, startup, { action: 'createFirstAdmin', target: email, message: how });
      return true;
    });
    if (!created) return;
    this.log.info('created the first admin', { email });
    if (generated) {
      print(
        `\n  Hangar created its first admin.\n    email:    ${email}\n    password: ${password}\n  This is shown once. Sign in and change it on the console's Account page (/account: your email, top right),\n  or set HANGAR_ADMIN_PASSWORD before the first start.\n`,
      );
    }
  }
}
