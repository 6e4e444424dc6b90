import { type GraphQLResolveInfo, Kind } from 'graphql';
import { RoleEnum, UserRef } from '../access/access.schema.js';
import { userByIdOrThrow } from '../access/access-store.js';
import type { User } from '../generated/prisma/client.js';
import { TooManyAttemptsError, UnauthenticatedError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { clearedSessionCookies, sessionCookies } from './cookies.js';
import { crossSiteSignIn } from './origin.js';
import type { ViewerUser } from './viewer.js';

const Viewer = builder
  .objectRef<{ user: ViewerUser; role: ViewerUser['role']; via: 'session' | 'token'; tokenName: string | null }>(
    'Viewer',
  )
  .implement({
    description: 'Who is calling, and with what role (a token can carry less than its owner).',
    fields: (t) => ({
      // A plain field, not a prismaField: Pothos maps a prismaField's selection to a Prisma query before the
      // resolver runs, a quarter of the cost of `viewer { user { email } }`, for an answer that is already here.
      // A relation asked for (apiTokens) is loaded by the relation field itself.
      user: t.field({
        type: UserRef,
        resolve: (v, _args, ctx, info) =>
          // The caller was identified with these fields a moment ago; asking the database again for them
          // would double the cost of the console's most frequent query.
          onlyAsks(info, IDENTIFIED_FIELDS) ? (v.user as User) : userByIdOrThrow(ctx.prisma, v.user.id),
      }),
      role: t.field({ type: RoleEnum, resolve: (v) => v.role }),
      via: t.string({ description: '"session" for the console, "token" for an API token.', resolve: (v) => v.via }),
      tokenName: t.string({ nullable: true, resolve: (v) => v.tokenName }),
    }),
  });

/** What identifying a caller already loaded of their user (a ViewerUser). */
const IDENTIFIED_FIELDS = new Set(['__typename', 'id', 'email', 'name', 'role']);

/**
 * Whether the field's selection asks only for these fields. A fragment of any kind counts as asking for more:
 * looking into it is not worth the risk of answering a field the object does not hold.
 */
function onlyAsks(info: GraphQLResolveInfo, fields: Set<string>): boolean {
  return info.fieldNodes.every((node) =>
    (node.selectionSet?.selections ?? []).every((s) => s.kind === Kind.FIELD && fields.has(s.name.value)),
  );
}

const LoginPayload = builder.objectRef<{ user: ViewerUser; csrfToken: string }>('LoginPayload').implement({
  fields: (t) => ({
    user: t.prismaField({
      type: 'User',
      resolve: (query, p, _args, ctx) => userByIdOrThrow(ctx.prisma, p.user.id, query),
    }),
    csrfToken: t.exposeString('csrfToken', {
      description: 'Send as the X-Hangar-CSRF header with every request that uses the session cookie.',
    }),
  }),
});

const PasswordChanged = builder.objectRef<{ signedOut: number }>('PasswordChanged').implement({
  fields: (t) => ({
    signedOut: t.exposeInt('signedOut', { description: 'How many of your other sessions were signed out.' }),
  }),
});

const ChangePasswordInput = builder.inputType('ChangePasswordInput', {
  fields: (t) => ({
    currentPassword: t.string({ required: true }),
    newPassword: t.string({ required: true, description: 'At least 12 characters.' }),
  }),
});

const LogoutPayload = builder.objectRef<{ ok: boolean }>('LogoutPayload').implement({
  fields: (t) => ({ ok: t.exposeBoolean('ok') }),
});

builder.queryField('viewer', (t) =>
  t.field({
    type: Viewer,
    nullable: true,
    description: "The signed-in user or the token's owner; null for anonymous callers and node agents.",
    resolve: (_root, _args, ctx) => {
      const v = ctx.viewer;
      if (v.kind === 'user') return { user: v.user, role: v.role, via: 'session' as const, tokenName: null };
      if (v.kind === 'token') return { user: v.user, role: v.role, via: 'token' as const, tokenName: v.tokenName };
      return null;
    },
  }),
);

builder.mutationFields((t) => ({
  login: t.field({
    type: LoginPayload,
    description:
      'Signs in to the console: sets the session cookie (HttpOnly) and the CSRF cookie. Refused from pages of other origins, and with TooManyAttemptsError after repeated wrong passwords.',
    errors: { types: [ValidationError, TooManyAttemptsError] },
    args: { email: t.arg.string({ required: true }), password: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => {
      // Where the request came from is the edge's to read (its headers); the service refuses and audits it.
      const crossSite = crossSiteSignIn(ctx.request.headers, ctx.config);
      const signedIn = unwrap(await ctx.services.auth.login(ctx.actor, args, crossSite));
      ctx.responseCookies.push(...sessionCookies(signedIn.session, ctx.secure));
      return signedIn;
    },
  }),
  changePassword: t.field({
    type: PasswordChanged,
    description:
      "Changes the caller's own password, given the current one. Every other session of the user is signed out; this one stays. An admin resets another user's password with updateUser.",
    authScopes: { viewer: true },
    errors: { types: [ValidationError, UnauthenticatedError, TooManyAttemptsError] },
    args: { input: t.arg({ type: ChangePasswordInput, required: true }) },
    resolve: async (_root, { input }, ctx) => unwrap(await ctx.services.auth.changePassword(ctx.actor, input)),
  }),
  logout: t.field({
    type: LogoutPayload,
    errors: {},
    resolve: async (_root, _args, ctx) => {
      const ended = unwrap(await ctx.services.auth.logout(ctx.actor));
      ctx.responseCookies.push(...clearedSessionCookies(ctx.secure));
      return { ok: ended };
    },
  }),
}));

export { UserRef };
