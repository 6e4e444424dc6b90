import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import { hashPassword, hashSecret, newSecret } from '../auth/secrets.js';
import { endSessions } from '../auth/sessions.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Db } from '../db/client.js';
import type { ApiToken, User } from '../generated/prisma/client.js';
import { Role } from '../generated/prisma/enums.js';
import { ConflictError, ForbiddenError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';

const roles = z.enum([Role.ADMIN, Role.OPERATOR, Role.VIEWER], { error: 'ADMIN, OPERATOR or VIEWER' });
const tokenName = z
  .string()
  .trim()
  .min(1, 'a token needs a name that says what uses it, such as "ci-deploy"')
  .max(100, 'at most 100 characters');
const password = z.string().min(12, 'at least 12 characters').max(1024, 'at most 1024 characters');

const createTokenInput = z.object({
  name: tokenName,
  role: roles,
  expiresAt: z.date().nullish(),
  callerOnly: z.boolean().nullish(),
  batch: z.boolean().nullish(),
});

const createUserInput = z.object({
  email: z.string().trim().toLowerCase().email('an email address such as ops@example.com'),
  name: z.string().trim().min(1, 'a display name').max(100, 'at most 100 characters'),
  role: roles,
  password,
});

const updateUserInput = z.object({
  name: z.string().trim().min(1, 'a display name').max(100, 'at most 100 characters').nullish(),
  role: roles.nullish(),
  disabled: z.boolean().nullish(),
  password: password.nullish(),
});

export class AccessService {
  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
  ) {}

  /** The caller's own tokens; an admin may ask for everyone's. */
  listTokens(viewer: Viewer, all: boolean) {
    const owner = viewer.kind === 'user' || viewer.kind === 'token' ? viewer.user.id : undefined;
    const everyone = all && (viewer.kind === 'user' || viewer.kind === 'token') && roleAtLeast(viewer.role, 'ADMIN');
    return this.db.apiToken.findMany({
      where: everyone ? {} : { userId: owner ?? '00000000-0000-0000-0000-000000000000' },
      orderBy: [{ revokedAt: { sort: 'desc', nulls: 'first' } }, { createdAt: 'desc' }],
    });
  }

  async createToken(
    actor: Actor,
    input: z.input<typeof createTokenInput>,
  ): Promise<Result<{ token: ApiToken; secret: string }>> {
    const parsed = parseInput(createTokenInput, input);
    if (!parsed.ok) return parsed;
    const { name, role, expiresAt } = parsed.value;
    const callerOnly = parsed.value.callerOnly ?? false;
    if (actor.viewer.kind !== 'user' && actor.viewer.kind !== 'token') {
      return fail(new ForbiddenError('API tokens belong to users: sign in as one to create a token'));
    }
    // A token never carries more than the person who made it: otherwise a viewer could mint an admin.
    if (!roleAtLeast(actor.viewer.role, role)) {
      return fail(
        new ValidationError(
          'input.role',
          `input.role: a token can have at most your own role (${actor.viewer.role}); ${role} is above it`,
        ),
      );
    }
    if (expiresAt && expiresAt <= new Date()) {
      return fail(
        new ValidationError(
          'input.expiresAt',
          'input.expiresAt: must be in the future, or empty for a token that does not expire',
        ),
      );
    }
    const secret = newSecret('api');
    const userId = actor.viewer.user.id;
    const token = await this.db.$transaction(async (tx) => {
      const t = await tx.apiToken.create({
        data: {
          name,
          role,
          expiresAt: expiresAt ?? null,
          callerOnly,
          batch: parsed.value.batch ?? false,
          userId,
          tokenHash: hashSecret(secret),
          prefix: secret.slice(0, 10),
        },
      });
      await this.audit.done(tx, actor, {
        action: 'createApiToken',
        target: name,
        message: `${callerOnly ? 'caller-only (calls models at /v1, nothing else), ' : ''}${parsed.value.batch ? 'batch (behind interactive requests), ' : ''}role ${role}${expiresAt ? `, expires ${expiresAt.toISOString()}` : ', no expiry'}`,
      });
      return t;
    });
    return ok({ token, secret });
  }

  async revokeToken(actor: Actor, id: string): Promise<Result<ApiToken>> {
    const token = z.string().uuid().safeParse(id).success ? await this.db.apiToken.findUnique({ where: { id } }) : null;
    if (!token) return fail(new NotFoundError(`no API token with id ${id}`));
    const isAdmin =
      (actor.viewer.kind === 'user' || actor.viewer.kind === 'token') && roleAtLeast(actor.viewer.role, 'ADMIN');
    const isOwner =
      (actor.viewer.kind === 'user' || actor.viewer.kind === 'token') && actor.viewer.user.id === token.userId;
    if (!isAdmin && !isOwner) return fail(new ForbiddenError('only its owner or an admin may revoke this token'));
    // Revoking twice is not an error: the script that retries after a timeout gets the same answer.
    if (token.revokedAt) return ok(token);
    return ok(
      await this.db.$transaction(async (tx) => {
        const t = await tx.apiToken.update({ where: { id }, data: { revokedAt: new Date() } });
        // Heard on commit by every replica: live subscriptions opened with this token end there and then.
        await notify(tx, 'credentials', `user:${token.userId}`);
        await this.audit.done(tx, actor, { action: 'revokeApiToken', target: token.name });
        return t;
      }),
    );
  }

  /**
   * Marks a token batch (its requests wait behind interactive ones, and are the first refused under pressure) or
   * interactive again: a job's token is often made before anyone knows it will run at night.
   */
  async setTokenBatch(actor: Actor, id: string, batch: boolean): Promise<Result<ApiToken>> {
    const token = z.string().uuid().safeParse(id).success ? await this.db.apiToken.findUnique({ where: { id } }) : null;
    if (!token) return fail(new NotFoundError(`no API token with id ${id}`));
    const isAdmin =
      (actor.viewer.kind === 'user' || actor.viewer.kind === 'token') && roleAtLeast(actor.viewer.role, 'ADMIN');
    const isOwner =
      (actor.viewer.kind === 'user' || actor.viewer.kind === 'token') && actor.viewer.user.id === token.userId;
    if (!isAdmin && !isOwner) {
      return fail(new ForbiddenError('only its owner or an admin may mark this token batch or interactive'));
    }
    if (token.batch === batch) return ok(token);
    return ok(
      await this.db.$transaction(async (tx) => {
        const t = await tx.apiToken.update({ where: { id }, data: { batch } });
        // Every process keeps identified tokens for a few seconds: this drops them, so the next request is judged
        // by the new mark in every server process.
        await notify(tx, 'credentials', `user:${token.userId}`);
        await this.audit.done(tx, actor, {
          action: 'setTokenBatch',
          target: token.name,
          message: batch ? 'batch (behind interactive requests)' : 'interactive',
        });
        return t;
      }),
    );
  }

  listUsers() {
    return this.db.user.findMany({ orderBy: { email: 'asc' } });
  }

  async createUser(actor: Actor, input: z.input<typeof createUserInput>): Promise<Result<User>> {
    const parsed = parseInput(createUserInput, input);
    if (!parsed.ok) return parsed;
    const { email, name, role } = parsed.value;
    if (await this.db.user.findUnique({ where: { email } })) {
      return fail(new ConflictError(`a user with email ${email} already exists`));
    }
    const passwordHash = await hashPassword(parsed.value.password);
    return ok(
      await this.db.$transaction(async (tx) => {
        const u = await tx.user.create({ data: { email, name, role, passwordHash } });
        await this.audit.done(tx, actor, { action: 'createUser', target: email, message: `role ${role}` });
        return u;
      }),
    );
  }

  async updateUser(actor: Actor, id: string, input: z.input<typeof updateUserInput>): Promise<Result<User>> {
    const parsed = parseInput(updateUserInput, input);
    if (!parsed.ok) return parsed;
    const user = z.string().uuid().safeParse(id).success ? await this.db.user.findUnique({ where: { id } }) : null;
    if (!user) return fail(new NotFoundError(`no user with id ${id}`));
    const { name, role, disabled, password: newPassword } = parsed.value;
    const demotes = (role && role !== 'ADMIN') || disabled === true;
    if (user.role === 'ADMIN' && demotes) {
      // Nobody could manage users or nodes any more, and getting back in would mean editing the database.
      const admins = await this.db.user.count({ where: { role: 'ADMIN', disabledAt: null } });
      if (admins <= 1)
        return fail(new ConflictError(`${user.email} is the last admin: make another user an admin first`));
    }
    const changes: string[] = [];
    if (name) changes.push(`name ${name}`);
    if (role) changes.push(`role ${role}`);
    if (disabled !== undefined && disabled !== null) changes.push(disabled ? 'disabled' : 'enabled');
    if (newPassword) changes.push('password changed');
    const passwordHash = newPassword ? await hashPassword(newPassword) : undefined;
    return ok(
      await this.db.$transaction(async (tx) => {
        const u = await tx.user.update({
          where: { id },
          data: {
            name: name ?? undefined,
            role: role ?? undefined,
            disabledAt: disabled === undefined || disabled === null ? undefined : disabled ? new Date() : null,
            passwordHash,
          },
        });
        // A disabled user or a changed password ends every open console session of that user.
        if (disabled || passwordHash) await endSessions(tx, id);
        // Live subscriptions were authorized with the old role or credentials: each is checked again on commit.
        // A new name too, since identified callers are kept for a few seconds (auth/credential-cache.ts) and
        // `viewer { user { name } }` is answered from them.
        if (disabled || passwordHash || (role && role !== user.role) || (name && name !== user.name))
          await notify(tx, 'credentials', `user:${id}`);
        await this.audit.done(tx, actor, {
          action: 'updateUser',
          target: user.email,
          message: changes.join(', ') || 'no change',
        });
        return u;
      }),
    );
  }
}
