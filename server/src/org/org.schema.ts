import type { Context } from '../context.js';
import { ConflictError, NotFoundError, unwrap, ValidationError } from '../lib/errors.js';
import { builder } from '../schema/builder.js';
import { type OwnerRef, ownerKey, parseOwnerKey, type Removal } from './org.service.js';

const OwnerScopeEnum = builder.enumType('OwnerScope', {
  description: 'What kind of principal owns a collection or an adapter.',
  values: {
    ORG: { value: 'org' },
    TEAM: { value: 'team' },
    PROJECT: { value: 'project' },
    USER: { value: 'user' },
    KEY: { value: 'key', description: 'An API token.' },
  } as const,
});

export const OrgRef = builder.prismaObject('Org', {
  description: 'An organisation: its teams and their projects, its members, its knowledge bases.',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    teams: t.relation('teams', { query: { orderBy: { name: 'asc' } } }),
    members: t.relation('memberships', {
      description: 'Everyone in the org, wherever in it: directly, in a team, or in a project.',
      query: { orderBy: { createdAt: 'asc' } },
    }),
    collections: t.relation('collections', { query: { orderBy: { name: 'asc' } } }),
  }),
});

export const TeamRef = builder.prismaObject('Team', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    path: t.string({
      description: 'org/team, as owners and addMember write it.',
      select: { name: true, org: { select: { name: true } } },
      resolve: (team) => `${team.org.name}/${team.name}`,
    }),
    org: t.relation('org'),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    projects: t.relation('projects', { query: { orderBy: { name: 'asc' } } }),
    members: t.relation('memberships', {
      description: "The team's own members; its projects' members are listed with each project.",
      query: { where: { projectId: null }, orderBy: { createdAt: 'asc' } },
    }),
  }),
});

export const ProjectRef = builder.prismaObject('Project', {
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    path: t.string({
      description: 'org/team/project, as owners and addMember write it.',
      select: { name: true, team: { select: { name: true, org: { select: { name: true } } } } },
      resolve: (p) => `${p.team.org.name}/${p.team.name}/${p.name}`,
    }),
    team: t.relation('team'),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
    members: t.relation('memberships', { query: { orderBy: { createdAt: 'asc' } } }),
  }),
});

export const MembershipRef = builder.prismaObject('Membership', {
  description: 'A user or an API token in an org, or in a team or project of it.',
  fields: (t) => ({
    id: t.exposeID('id'),
    org: t.relation('org'),
    team: t.relation('team', { nullable: true }),
    project: t.relation('project', { nullable: true }),
    place: t.string({
      description: 'Where: org, org/team or org/team/project.',
      select: {
        org: { select: { name: true } },
        team: { select: { name: true } },
        project: { select: { name: true } },
      },
      resolve: (m) => [m.org.name, m.team?.name, m.project?.name].filter(Boolean).join('/'),
    }),
    member: t.string({
      description: 'Who, as owners write it: "user:alice@example.com" or "key:<token id>".',
      select: { userId: true, apiTokenId: true, user: { select: { email: true } } },
      resolve: (m) => (m.user ? `user:${m.user.email}` : `key:${m.apiTokenId}`),
    }),
    memberName: t.string({
      description:
        'Who, as people read it, as owners are shown: "user:alice@example.com", "key:ci-deploy (alice@example.com)".',
      select: { userId: true, apiTokenId: true },
      resolve: (m, _args, ctx) =>
        ownerLabel(ctx, m.userId ? { scope: 'user', id: m.userId } : { scope: 'key', id: m.apiTokenId as string }),
    }),
    user: t.relation('user', { nullable: true }),
    apiToken: t.relation('apiToken', {
      nullable: true,
      description: "The API token, when the member is one: shown to admins, as other people's tokens are.",
      authScopes: { admin: true },
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
  }),
});

export const CollectionRef = builder.prismaObject('Collection', {
  description:
    'A knowledge base. Readable by: org-owned → every member of the org; team-owned → the team and its projects; project-owned → the project; user-owned → that user; key-owned → that API token.',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    org: t.relation('org'),
    ownerScope: t.field({ type: OwnerScopeEnum, resolve: (c) => c.ownerScope }),
    ownerId: t.exposeID('ownerId'),
    owner: t.string({
      description: 'The owner for people: "team:acme/research", "user:alice@example.com".',
      resolve: (c, _args, ctx) => ownerLabel(ctx, { scope: c.ownerScope, id: c.ownerId }),
    }),
    createdAt: t.expose('createdAt', { type: 'DateTime' }),
  }),
});

// A list of collections (or adapters, jobs) names many owners; they are looked up together, once per request, not
// once per row. Exported for other lists that show owners: ownerLabel(ctx, parseOwnerKey(row.owner)).
const labelBatches = new WeakMap<Context, (owner: OwnerRef) => Promise<string>>();
export function ownerLabel(ctx: Context, owner: OwnerRef): Promise<string> {
  let load = labelBatches.get(ctx);
  if (!load) {
    let queue: { owner: OwnerRef; resolve: (s: string) => void; reject: (e: unknown) => void }[] = [];
    load = (o) =>
      new Promise((resolve, reject) => {
        queue.push({ owner: o, resolve, reject });
        if (queue.length > 1) return;
        setImmediate(() => {
          const batch = queue;
          queue = [];
          ctx.services.org.formatOwners(batch.map((b) => b.owner)).then(
            (labels) => {
              for (const b of batch) b.resolve(labels.get(ownerKey(b.owner)) ?? ownerKey(b.owner));
            },
            (err) => {
              for (const b of batch) b.reject(err);
            },
          );
        });
      });
    labelBatches.set(ctx, load);
  }
  return load(owner);
}

/**
 * The one name for a stored owner ("team:<uuid>") everywhere a page shows it: "team:acme/support". Every list that
 * shows owners (models, adapters, jobs, tokens, audit) answers its `ownerName` with this, so a renamed team reads
 * the same on every page at once. Null stays null (public); a key that is not an owner key is shown as it is.
 */
export function ownerName(ctx: Context, stored: string | null | undefined): Promise<string> | null {
  if (!stored) return null;
  const parsed = parseOwnerKey(stored);
  return parsed ? ownerLabel(ctx, parsed) : Promise.resolve(stored);
}

const RemovedOrg = builder.objectRef<{ id: string; name: string }>('RemovedOrg').implement({
  fields: (t) => ({ id: t.exposeID('id'), name: t.exposeString('name') }),
});

const AddMemberInput = builder.inputType('AddMemberInput', {
  description: 'A user or an API token (one of the two) joins an org, or a team or project in it.',
  fields: (t) => ({
    org: t.string({ required: true, description: "The org's name or id." }),
    team: t.string({ required: false, description: 'Its name in the org, its path org/team, or its id.' }),
    project: t.string({
      required: false,
      description: 'Its name in the team (with team), its path org/team/project, or its id.',
    }),
    user: t.string({ required: false, description: "The user's email or id." }),
    apiToken: t.id({ required: false, description: "The API token's id." }),
  }),
});

const CreateCollectionInput = builder.inputType('CreateCollectionInput', {
  fields: (t) => ({
    org: t.string({ required: true, description: "The org's name or id." }),
    name: t.string({ required: true }),
    owner: t.string({
      required: true,
      description:
        'Who may read it, inside the org: org:<name or id>, team:<org/team or id>, project:<org/team/project or id>, user:<email or id> or key:<API token id>.',
    }),
  }),
});

builder.queryFields((t) => ({
  orgs: t.prismaField({
    type: ['Org'],
    authScopes: { viewer: true },
    resolve: (query, _root, _args, ctx) => ctx.prisma.org.findMany({ ...query, orderBy: { name: 'asc' } }),
  }),
  org: t.prismaField({
    type: 'Org',
    nullable: true,
    authScopes: { viewer: true },
    args: { name: t.arg.string({ required: true, description: "The org's name, or its id." }) },
    resolve: (query, _root, args, ctx) =>
      ctx.prisma.org.findUnique({ ...query, where: ctx.services.org.orgWhere(args.name) }),
  }),
  collections: t.prismaField({
    type: ['Collection'],
    description: "Every org's knowledge bases, or one org's (by its name or id).",
    authScopes: { viewer: true },
    args: { org: t.arg.string({ required: false }) },
    resolve: (query, _root, args, ctx) =>
      ctx.prisma.collection.findMany({
        ...query,
        where: args.org ? { org: ctx.services.org.orgWhere(args.org) } : undefined,
        orderBy: [{ org: { name: 'asc' } }, { name: 'asc' }],
      }),
  }),
}));

builder.mutationFields((t) => ({
  createOrg: t.field({
    type: OrgRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { name: t.arg.string({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.createOrg(ctx.actor, args)),
  }),
  deleteOrg: t.field({
    type: RemovedOrg,
    description: 'Deletes an org with its teams, projects and memberships; refused while it holds collections.',
    authScopes: { admin: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.deleteOrg(ctx.actor, String(args.id))),
  }),
  createTeam: t.field({
    type: TeamRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      org: t.arg.string({ required: true, description: "The org's name or id." }),
      name: t.arg.string({ required: true }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.createTeam(ctx.actor, args)),
  }),
  deleteTeam: t.field({
    type: OrgRef,
    description: 'Deletes a team with its projects and memberships; answers with its org.',
    authScopes: { admin: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.deleteTeam(ctx.actor, String(args.id))),
  }),
  createProject: t.field({
    type: ProjectRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: {
      team: t.arg.string({ required: true, description: "The team's path org/team, or its id." }),
      name: t.arg.string({ required: true }),
    },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.createProject(ctx.actor, args)),
  }),
  deleteProject: t.field({
    type: TeamRef,
    description: 'Deletes a project with its memberships; answers with its team.',
    authScopes: { admin: true },
    errors: { types: [NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.deleteProject(ctx.actor, String(args.id))),
  }),
  addMember: t.field({
    type: MembershipRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { input: t.arg({ type: AddMemberInput, required: true }) },
    resolve: async (_root, { input }, ctx) =>
      unwrap(
        await ctx.services.org.addMember(ctx.actor, {
          ...input,
          apiToken: input.apiToken === null || input.apiToken === undefined ? input.apiToken : String(input.apiToken),
        }),
      ),
  }),
  removeMember: t.field({
    type: OrgRef,
    description: 'Ends a membership; answers with the org it was in.',
    authScopes: { admin: true },
    errors: { types: [NotFoundError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.removeMember(ctx.actor, String(args.id))),
  }),
  createCollection: t.field({
    type: CollectionRef,
    authScopes: { admin: true },
    errors: { types: [ValidationError, ConflictError] },
    args: { input: t.arg({ type: CreateCollectionInput, required: true }) },
    resolve: async (_root, { input }, ctx) => unwrap(await ctx.services.org.createCollection(ctx.actor, input)),
  }),
  deleteCollection: t.field({
    type: OrgRef,
    description: "Deletes a collection's record; answers with its org.",
    authScopes: { admin: true },
    errors: { types: [NotFoundError] },
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_root, args, ctx) => unwrap(await ctx.services.org.deleteCollection(ctx.actor, String(args.id))),
  }),
}));

// ─── the Organisations page: renames, and what a removal would do before it is confirmed ───────────────────────

const RemovalRef = builder.objectRef<Removal>('OrgRemoval').implement({
  description:
    'What removing an org, team or project would do, shown before it is confirmed. While it owns collections, models, adapters or training jobs the removal is refused: delete those or give them another owner first.',
  fields: (t) => ({
    what: t.exposeString('what', { description: '"team acme/support".' }),
    blocked: t.boolean({
      description: 'Whether the removal would be refused now, for what it still owns.',
      resolve: (r) => r.collections.length + r.models.length + r.adapters.length + r.trainJobs.length > 0,
    }),
    collections: t.exposeStringList('collections'),
    models: t.exposeStringList('models'),
    adapters: t.exposeStringList('adapters'),
    trainJobs: t.exposeStringList('trainJobs'),
    teams: t.exposeStringList('teams', { description: 'The teams removed with it (org/team).' }),
    projects: t.exposeStringList('projects', { description: 'The projects removed with it (org/team/project).' }),
    members: t.exposeStringList('members', {
      description: 'The memberships that end, as "user:alice@example.com at acme/support".',
    }),
    apiTokens: t.exposeStringList('apiTokens', {
      description: 'The API tokens among those members: what their scripts may call narrows at once.',
    }),
  }),
});

for (const [type, kind] of [
  ['Org', 'org'],
  ['Team', 'team'],
  ['Project', 'project'],
] as const) {
  builder.prismaObjectField(type, 'removal', (t) =>
    t.field({
      type: RemovalRef,
      description: 'What removing it would do, and whether it would be refused now.',
      authScopes: { admin: true },
      select: { id: true },
      resolve: async (row, _args, ctx) => {
        const r = await ctx.services.org.removal(kind, row.id);
        if (!r) throw new Error(`${kind} ${row.id} is gone`);
        return r;
      },
    }),
  );
}

const renameDescription = (what: string) =>
  `Renames ${what}: what it owns stays its own (owners are kept by id) and every page shows the new name at once.`;

builder.mutationFields((t) => ({
  renameOrg: t.field({
    type: OrgRef,
    description: renameDescription('an org'),
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), name: t.arg.string({ required: true }) },
    resolve: async (_root, a, ctx) =>
      unwrap(await ctx.services.org.renameOrg(ctx.actor, { id: String(a.id), name: a.name })),
  }),
  renameTeam: t.field({
    type: TeamRef,
    description: renameDescription('a team'),
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), name: t.arg.string({ required: true }) },
    resolve: async (_root, a, ctx) =>
      unwrap(await ctx.services.org.renameTeam(ctx.actor, { id: String(a.id), name: a.name })),
  }),
  renameProject: t.field({
    type: ProjectRef,
    description: renameDescription('a project'),
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), name: t.arg.string({ required: true }) },
    resolve: async (_root, a, ctx) =>
      unwrap(await ctx.services.org.renameProject(ctx.actor, { id: String(a.id), name: a.name })),
  }),
  renameCollection: t.field({
    type: CollectionRef,
    description: renameDescription('a knowledge-base collection'),
    authScopes: { admin: true },
    errors: { types: [ValidationError, NotFoundError, ConflictError] },
    args: { id: t.arg.id({ required: true }), name: t.arg.string({ required: true }) },
    resolve: async (_root, a, ctx) =>
      unwrap(await ctx.services.org.renameCollection(ctx.actor, { id: String(a.id), name: a.name })),
  }),
}));
