import type { ApiToken } from '../generated/prisma/client.js';
import { Role } from '../generated/prisma/enums.js';
import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';

export const RoleEnum = builder.enumType(Role, {
  name: 'Role',
  description:
    'VIEWER reads everything; OPERATOR also changes the mirror, the catalog and jobs; ADMIN also manages users, tokens and nodes.',
});

export const UserRef = builder.prismaObject('User', {
  fields: (t) => ({
    id: t.exposeID('id'),
    email: t.exposeString('email'),
    name: t.exposeString('name'),
    role: t.expose('role', { type: RoleEnum }),
    disabled: t.boolean({ resolve: (u) => u.disabledAt !== null }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    apiTokens: t.relation('apiTokens', {
      description: "The user's API tokens: visible to that user and to admins.",
      authScopes: (user, _args, ctx) =>
        (ctx.viewer.kind === 'user' || ctx.viewer.kind === 'token') && ctx.viewer.user.id === user.id
          ? true
          : { admin: true },
      query: { orderBy: { createdAt: 'desc' } },
    }),
  }),
});

export const ApiTokenRef = builder.prismaObject('ApiToken', {
  description: 'A credential for scripts. Its secret is shown once, when it is created; only a hash is kept.',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    prefix: t.exposeString('prefix', { description: 'The first characters of the secret, to tell tokens apart.' }),
    role: t.expose('role', { type: RoleEnum }),
    callerOnly: t.exposeBoolean('callerOnly', {
      description:
        'Calls models at /v1 and nothing else: refused on GraphQL, /mirror and /api, so a key handed to an application cannot read or change the control plane.',
    }),
    batch: t.exposeBoolean('batch', {
      description: 'Its requests wait behind interactive ones for a replica and are the first refused under pressure.',
    }),
    owner: t.relation('user'),
    ownerName: t.string({
      description: 'Whose it is, as owners are written everywhere: "user:alice@example.com".',
      select: { user: { select: { email: true } } },
      resolve: (tk) => `user:${tk.user.email}`,
    }),
    memberOf: t.stringList({
      description: 'Where in the organisation tree it is a member (org, org/team, org/team/project): what it may call.',
      select: {
        memberships: {
          select: {
            org: { select: { name: true } },
            team: { select: { name: true } },
            project: { select: { name: true } },
          },
          orderBy: { createdAt: 'asc' },
        },
      },
      resolve: (tk) => tk.memberships.map((m) => [m.org.name, m.team?.name, m.project?.name].filter(Boolean).join('/')),
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    expiresAt: t.expose('expiresAt', { type: 'DateTime', nullable: true }),
    lastUsedAt: t.expose('lastUsedAt', { type: 'DateTime', nullable: true }),
    revokedAt: t.expose('revokedAt', { type: 'DateTime', nullable: true }),
    active: t.boolean({
      description: 'Neither revoked nor expired.',
      resolve: (tk) => !tk.revokedAt && !(tk.expiresAt && tk.expiresAt <= new Date()),
    }),
  }),
});

const CreatedApiToken = builder.objectRef<{ token: ApiToken; secret: string }>('CreatedApiToken').implement({
  fields: (t) => ({
    token: t.field({ type: ApiTokenRef, resolve: (p) => p.token }),
    secret: t.exposeString('secret', {
      description: 'Send as "Authorization: Bearer <secret>". Shown this once: Hangar keeps only its hash.',
    }),
  }),
});

const CreateApiTokenInput = builder.inputType('CreateApiTokenInput', {
  fields: (t) => ({
    name: t.string({ required: true, description: 'What uses it, such as "ci-deploy".' }),
    role: t.field({ type: RoleEnum, required: true, description: 'At most the role of the user creating it.' }),
    expiresAt: t.field({ type: 'DateTime', required: false, description: 'Empty: the token does not expire.' }),
    callerOnly: t.boolean({
      required: false,
      defaultValue: false,
      description:
        'A caller token: calls the models its user may call at /v1, and is refused everywhere else (GraphQL, /mirror, /api).',
    }),
    batch: t.boolean({
      required: false,
      defaultValue: false,
      description:
        'A batch token (a nightly job): its requests wait behind interactive ones for a replica, and are the first refused when a budget runs low.',
    }),
  }),
});

const CreateUserInput = builder.inputType('CreateUserInput', {
  fields: (t) => ({
    email: t.string({ required: true }),
    name: t.string({ required: true }),
    role: t.field({ type: RoleEnum, required: true }),
    password: t.string({ required: true, description: 'At least 12 characters.' }),
  }),
});

const UpdateUserInput = builder.inputType('UpdateUserInput', {
  fields: (t) => ({
    name: t.string({ required: false }),
    role: t.field({ type: RoleEnum, required: false }),
    disabled: t.boolean({ required: false, description: 'A disabled user keeps their history but cannot sign in.' }),
    password: t.string({ required: false }),
  }),
});

builder.queryFields((t) => ({
  users: t.prismaField({
    type: ['User'],
    authScopes: { admin: true },
    resolve: (query, _root, _args, ctx) => ctx.prisma.user.findMany({ ...query, orderBy: { email: 'asc' } }),
  }),
  apiTokens: t.field({
    type: [ApiTokenRef],
    description: "The caller's own tokens; an admin asking with all: true sees everyone's.",
    authScopes: { viewer: true },
    args: { all: t.arg.boolean({ required: false, defaultValue: false }) },
    resolve: (_root, args, ctx) => ctx.services.access.listTokens(ctx.viewer, args.all ?? false),
  }),
}));

builder.mutationFields((t) => ({
  createApiToken: t.field({
    type: CreatedApiToken,
    authScopes: { viewer: true },
    errors: { types: [ValidationError] },
    args: { input: t.arg({ type: CreateApiTokenInput, required: true }) },
    resolve: async (_root, { input }, ctx) => unwrap(await ctx.services.access.createToken(ctx.actor, input)),
  }),
  revokeApiToken: t.field({
    type: ApiTokenRef,
    authScopes: { viewer: true },
    errors: { types: [NotFoundError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, { id }, ctx) => unwrap(await ctx.services.access.revokeToken(ctx.actor, String(id))),
  }),
  setTokenBatch: t.field({
    type: ApiTokenRef,
    description:
      'Marks a token batch (its requests wait behind interactive ones and are the first refused when a budget runs low) or interactive. Its owner or an admin.',
    authScopes: { viewer: true },
    errors: { types: [NotFoundError] },
    args: { id: t.arg.id({ required: true }), batch: t.arg.boolean({ required: true }) },
    resolve: async (_root, { id, batch }, ctx) =>
      unwrap(await ctx.services.access.setTokenBatch(ctx.actor, String(id), batch)),
  }),
  createUser: t.field({
    type: UserRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { input: t.arg({ type: CreateUserInput, required: true }) },
    resolve: async (_root, { input }, ctx) => unwrap(await ctx.services.access.createUser(ctx.actor, input)),
  }),
  updateUser: t.field({
    type: UserRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: UpdateUserInput, required: true }) },
    resolve: async (_root, { id, input }, ctx) =>
      unwrap(await ctx.services.access.updateUser(ctx.actor, String(id), input)),
  }),
}));
