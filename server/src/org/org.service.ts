import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Context } from '../context.js';
import type { Db, Tx } from '../db/client.js';
import type { ApiToken, Collection, Membership, Org, Prisma, Project, Team, User } from '../generated/prisma/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';

// The organisation tree (org → team → project, with users and API tokens as members) and the one question
// training asks of it: may the owner of an adapter read the knowledge bases its pairs come from?
//
// An adapter repeats what it was trained on to everyone who may call it. So an owner X may read a collection C
// only when everyone X stands for is already among C's readers. Readers of C (DESIGN.md §4): org-owned → every
// member of the org, wherever in it; team-owned → the team's members and its projects' members; project-owned
// → the project's members; user-owned → that user; key-owned → that API token. Applied to an owner:
//
//   owner X ╲ C owned by   org O             team T                    project P          user U    key K
//   org O'                 O' = O            no (O' is wider)          no                 no        no
//   team T'                T' is in O        T' = T                    no (T' is wider)   no        no
//   project P'             P' is in O        P' is in T                P' = P             no        no
//   user U'                U' is in O        U' is in T or a project   U' is in P         U' = U    no
//                          (anywhere)        of T
//   key K'                 K' is in O        K' is in T or a project   K' is in P         no        K' = K
//                          (anywhere)        of T
//
// "Is in" means a membership (addMember). A key is a principal of its own: it reads what it was made a member of,
// not what its user may, because a key is handed to a script that should see less than the person. For the same
// reason a user does not read their keys' collections, nor a key its user's. Nothing reads across orgs.

export type OwnerRef = { scope: OwnerScope; id: string };
export type ResolvedOwner = OwnerRef & {
  /** For people, as formatOwner writes it: "team:acme/research", "key:ci-deploy (alice@example.com)". */
  label: string;
};

/** How an owner is stored (Adapter.owner, TrainJob.owner, Collection's scope and id): "team:<uuid>". */
export function ownerKey(owner: OwnerRef): string {
  return `${owner.scope}:${owner.id}`;
}

/** Reads a stored owner key back; undefined for anything that is not "scope:<uuid>". */
export function parseOwnerKey(key: string): OwnerRef | undefined {
  const m = /^(org|team|project|user|key):(.+)$/.exec(key);
  if (!m || !isId(m[2] as string)) return undefined;
  return { scope: m[1] as OwnerScope, id: m[2] as string };
}

const OWNER_FORMS =
  'org:<name or id>, team:<org/team or id>, project:<org/team/project or id>, user:<email or id> or key:<API token id>';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const isId = (s: string) => UUID.test(s);

// Names share their fields with ids (org: "acme" or its id), so a name that reads as an id would be ambiguous.
const entityName = (what: string) =>
  resourceName(what).refine((s) => !isId(s), `${what} may not look like an id (8-4-4-4-12 hex digits)`);
const ref = (what: string) => z.string().trim().min(1, what).max(400, 'at most 400 characters');

const createOrgInput = z.object({ name: entityName('an org name') });
const createTeamInput = z.object({ org: ref('the org, by name or id'), name: entityName('a team name') });
const createProjectInput = z.object({
  team: ref('the team, by its path org/team or its id'),
  name: entityName('a project name'),
});
const addMemberInput = z.object({
  org: ref('the org, by name or id'),
  team: ref('the team: its name in the org, its path org/team, or its id').nullish(),
  project: ref('the project: its name in the team, its path org/team/project, or its id').nullish(),
  user: ref("the user's email or id").nullish(),
  apiToken: ref("the API token's id").nullish(),
});
const createCollectionInput = z.object({
  org: ref('the org, by name or id'),
  name: entityName('a collection name'),
  owner: ref(`the owner: ${OWNER_FORMS}`),
});

type TeamIn = Team & { org: Org };
type ProjectIn = Project & { team: TeamIn };
type KeyOf = ApiToken & { user: User };
type Looked = ResolvedOwner & { orgId: string | null };
type MemberRow = Membership & {
  org: Org;
  team: Team | null;
  project: Project | null;
  user: User | null;
  apiToken: KeyOf | null;
};

/** The owner ids, by scope, whose collections an owner may read: the table above, worked out for one owner. */
export type Reach = Record<OwnerScope, Set<string>>;

// Every change to the tree takes this lock in its transaction, so the checks it makes (a team owns nothing, an
// owner is inside the org) still hold when it commits, also with several server replicas.
const ORG_LOCK = 0x6f726773; // 'orgs'

/** Takes the org tree's lock in a transaction that stores an owner, so the owner cannot be deleted meanwhile. */
export async function lockOrgTree(tx: Tx) {
  await tx.$executeRaw`SELECT pg_advisory_xact_lock(${ORG_LOCK})`;
}

const memberInclude = {
  org: true,
  team: true,
  project: true,
  user: true,
  apiToken: { include: { user: true } },
} as const;

export class OrgService {
  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
  ) {}

  // ─── owners and readability (used by training) ─────────────────────────────────────────────────────────────

  /**
   * Reads an owner as an operator writes it: org:<name or id>, team:<org/team or id>, project:<org/team/project
   * or id>, user:<email or id>, key:<API token id>. A refusal is a ValidationError on `field` (default "owner")
   * that says which forms are accepted or what was not found. Disabled users and revoked or expired keys are
   * refused: nobody could use what they would own. Store the result as ownerKey(result).
   */
  async resolveOwner(
    owner: string,
    opts: { field?: string; db?: Tx } = {},
  ): Promise<Result<ResolvedOwner, ValidationError>> {
    const found = await this.lookupOwner(opts.db ?? this.db, owner, opts.field ?? 'owner');
    if (!found.ok) return found;
    const { scope, id, label } = found.value;
    return ok({ scope, id, label });
  }

  /** The ids of every collection `owner` may read (the table at the top of this file). */
  async readableCollections(owner: OwnerRef, db: Tx = this.db): Promise<Set<string>> {
    const reach = await this.reach(db, owner);
    const or = (Object.keys(reach) as OwnerScope[])
      .filter((s) => reach[s].size > 0)
      .map((s) => ({ ownerScope: s, ownerId: { in: [...reach[s]] } }));
    if (!or.length) return new Set();
    const rows = await db.collection.findMany({ where: { OR: or }, select: { id: true } });
    return new Set(rows.map((r) => r.id));
  }

  /** A collection by id; null for one that does not exist (or an id that is not one). */
  collection(id: string, db: Tx = this.db): Promise<Collection | null> {
    return isId(id) ? db.collection.findUnique({ where: { id } }) : Promise.resolve(null);
  }

  /** Whether `owner` may read collection `collectionId`; false for a collection that does not exist. */
  async canRead(owner: OwnerRef, collectionId: string, db: Tx = this.db): Promise<boolean> {
    if (!isId(collectionId)) return false;
    const c = await db.collection.findUnique({ where: { id: collectionId } });
    if (!c) return false;
    return (await this.reach(db, owner))[c.ownerScope].has(c.ownerId);
  }

  /**
   * Whether `caller` (a user, or an API token as a key of its own) is among those who may read what `owner` owns:
   * the readers a collection owned by `owner` would have. This is who may read an owned job's pairs and
   * artifacts and fetch an owned adapter: what was trained on the owner's collections says what they say.
   */
  async admits(owner: OwnerRef, caller: OwnerRef, db: Tx = this.db): Promise<boolean> {
    if (!isId(owner.id) || !isId(caller.id)) return false;
    return (await this.reach(db, caller))[owner.scope].has(owner.id);
  }

  /**
   * Whether a signed-in caller may read what a stored owner key ("team:<id>") owns; null is public: everyone may.
   * Admins may (they manage the tree and could add themselves). A session reads as its user, an API token as its
   * key, never as its user (the table above: a key is handed to a script that should see less than the person).
   * Nodes and Hangar's own passes are for the caller to decide: they are not in the tree.
   */
  async mayRead(viewer: Viewer, owner: string | null): Promise<boolean> {
    if (owner === null) return true;
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return false;
    if (roleAtLeast(viewer.role, 'ADMIN')) return true;
    const parsed = parseOwnerKey(owner);
    if (!parsed) return false;
    return this.admits(
      parsed,
      viewer.kind === 'user' ? { scope: 'user', id: viewer.user.id } : { scope: 'key', id: viewer.tokenId },
    );
  }

  /**
   * Every owner a caller at /v1 stands for: the token's user with the user's memberships, and the token as a key
   * with its own. Calling is not reading pairs (mayRead, where a key stands for itself alone): an adapter answers
   * questions, it does not hand over its data, so a team member's application calls the team's adapters with
   * any of that member's tokens. An owner key "team:<id>" admits the caller when reach.team has the id.
   */
  async callerReach(caller: { userId: string; tokenId?: string }, db: Tx = this.db): Promise<Reach> {
    const [user, key] = await Promise.all([
      this.reach(db, { scope: 'user', id: caller.userId }),
      caller.tokenId ? this.reach(db, { scope: 'key', id: caller.tokenId }) : undefined,
    ]);
    if (key) for (const scope of Object.keys(user) as OwnerScope[]) for (const id of key[scope]) user[scope].add(id);
    return user;
  }

  /**
   * For display: "team:acme/research", "user:alice@example.com", "key:ci-deploy (alice@example.com)". Takes an
   * owner or a stored key; one that no longer exists reads "team:<id> (deleted)".
   */
  async formatOwner(owner: OwnerRef | string): Promise<string> {
    const parsed = typeof owner === 'string' ? parseOwnerKey(owner) : owner;
    if (!parsed) return String(owner);
    return (await this.formatOwners([parsed])).get(ownerKey(parsed)) as string;
  }

  /** formatOwner for many at once (a list of adapters or collections), in at most one query per scope. */
  async formatOwners(owners: OwnerRef[], db: Tx = this.db): Promise<Map<string, string>> {
    const ids = (scope: OwnerScope) => [
      ...new Set(owners.filter((o) => o.scope === scope && isId(o.id)).map((o) => o.id)),
    ];
    const none = Promise.resolve([]);
    const [orgs, teams, projects, users, keys] = await Promise.all([
      ids('org').length ? db.org.findMany({ where: { id: { in: ids('org') } } }) : none,
      ids('team').length ? db.team.findMany({ where: { id: { in: ids('team') } }, include: { org: true } }) : none,
      ids('project').length
        ? db.project.findMany({ where: { id: { in: ids('project') } }, include: { team: { include: { org: true } } } })
        : none,
      ids('user').length ? db.user.findMany({ where: { id: { in: ids('user') } } }) : none,
      ids('key').length ? db.apiToken.findMany({ where: { id: { in: ids('key') } }, include: { user: true } }) : none,
    ]);
    const labels = new Map<string, string>();
    for (const o of orgs as Org[]) labels.set(`org:${o.id}`, `org:${o.name}`);
    for (const t of teams as TeamIn[]) labels.set(`team:${t.id}`, `team:${teamPath(t)}`);
    for (const p of projects as ProjectIn[]) labels.set(`project:${p.id}`, `project:${projectPath(p)}`);
    for (const u of users as User[]) labels.set(`user:${u.id}`, `user:${u.email}`);
    for (const k of keys as KeyOf[]) labels.set(`key:${k.id}`, `key:${keyLabel(k)}`);
    for (const o of owners) {
      if (!labels.has(ownerKey(o))) labels.set(ownerKey(o), `${ownerKey(o)} (deleted)`);
    }
    return labels;
  }

  private async reach(db: Tx, owner: OwnerRef): Promise<Reach> {
    const reach: Reach = { org: new Set(), team: new Set(), project: new Set(), user: new Set(), key: new Set() };
    if (!isId(owner.id)) return reach;
    switch (owner.scope) {
      case 'org':
        reach.org.add(owner.id);
        break;
      case 'team': {
        const team = await db.team.findUnique({ where: { id: owner.id } });
        if (team) {
          reach.org.add(team.orgId);
          reach.team.add(team.id);
        }
        break;
      }
      case 'project': {
        const project = await db.project.findUnique({ where: { id: owner.id }, include: { team: true } });
        if (project) {
          reach.org.add(project.team.orgId);
          reach.team.add(project.teamId);
          reach.project.add(project.id);
        }
        break;
      }
      case 'user':
      case 'key': {
        reach[owner.scope].add(owner.id);
        const memberships = await db.membership.findMany({
          where: owner.scope === 'user' ? { userId: owner.id } : { apiTokenId: owner.id },
          include: { project: { select: { teamId: true } } },
        });
        for (const m of memberships) {
          reach.org.add(m.orgId);
          // A project's member is in its team too, for reading: team-owned is readable by the team's projects.
          const teamId = m.teamId ?? m.project?.teamId;
          if (teamId) reach.team.add(teamId);
          if (m.projectId) reach.project.add(m.projectId);
        }
        break;
      }
    }
    return reach;
  }

  private async lookupOwner(db: Tx, owner: string, field: string): Promise<Result<Looked, ValidationError>> {
    const m = /^(org|team|project|user|key):(.+)$/.exec(owner.trim());
    if (!m) return fail(new ValidationError(field, `${field}: an owner is ${OWNER_FORMS}; "${owner}" is not`));
    const scope = m[1] as OwnerScope;
    const value = (m[2] as string).trim();
    switch (scope) {
      case 'org': {
        const org = await this.findOrg(db, value, field);
        return org.ok ? ok({ scope, id: org.value.id, label: `org:${org.value.name}`, orgId: org.value.id }) : org;
      }
      case 'team': {
        const team = await this.findTeam(db, value, field);
        return team.ok
          ? ok({ scope, id: team.value.id, label: `team:${teamPath(team.value)}`, orgId: team.value.orgId })
          : team;
      }
      case 'project': {
        const p = await this.findProject(db, value, field);
        return p.ok
          ? ok({ scope, id: p.value.id, label: `project:${projectPath(p.value)}`, orgId: p.value.team.orgId })
          : p;
      }
      case 'user': {
        const user = await this.findUser(db, value, field);
        return user.ok ? ok({ scope, id: user.value.id, label: `user:${user.value.email}`, orgId: null }) : user;
      }
      case 'key': {
        const key = await this.findKey(db, value, field);
        return key.ok ? ok({ scope, id: key.value.id, label: `key:${keyLabel(key.value)}`, orgId: null }) : key;
      }
    }
  }

  // ─── finding things by what an operator types ──────────────────────────────────────────────────────────────

  /** An org by name or id. */
  private async findOrg(db: Tx, value: string, field: string): Promise<Result<Org, ValidationError>> {
    const org = await db.org.findUnique({ where: isId(value) ? { id: value } : { name: value } });
    if (!org) return fail(new ValidationError(field, `${field}: no org ${value} (an org is named by its name or id)`));
    return ok(org);
  }

  /** A team by id or path org/team; a bare name when `within` says which org. */
  private async findTeam(db: Tx, value: string, field: string, within?: Org): Promise<Result<TeamIn, ValidationError>> {
    let team: TeamIn | null;
    if (isId(value)) {
      team = await db.team.findUnique({ where: { id: value }, include: { org: true } });
      if (!team) return fail(new ValidationError(field, `${field}: no team with id ${value}`));
    } else {
      const parts = value.split('/');
      if (parts.length > 2 || (parts.length === 1 && !within) || parts.some((p) => !p)) {
        const forms = within ? 'its name in the org, its path org/team, or its id' : 'its path org/team, or its id';
        return fail(new ValidationError(field, `${field}: a team is named by ${forms}; "${value}" is not`));
      }
      const [orgName, teamName] = parts.length === 2 ? (parts as [string, string]) : [within?.name ?? '', value];
      const org = parts.length === 2 ? await db.org.findUnique({ where: { name: orgName } }) : (within ?? null);
      if (!org) return fail(new ValidationError(field, `${field}: no org ${orgName}, so no team ${value}`));
      const t = await db.team.findUnique({ where: { orgId_name: { orgId: org.id, name: teamName } } });
      if (!t) return fail(new ValidationError(field, `${field}: org ${org.name} has no team ${teamName}`));
      team = { ...t, org };
    }
    if (within && team.orgId !== within.id) {
      return fail(
        new ValidationError(field, `${field}: team ${teamPath(team)} is in org ${team.org.name}, not ${within.name}`),
      );
    }
    return ok(team);
  }

  /** A project by id or path org/team/project; a bare name when `within.team` says which team. */
  private async findProject(
    db: Tx,
    value: string,
    field: string,
    within: { org?: Org; team?: TeamIn } = {},
  ): Promise<Result<ProjectIn, ValidationError>> {
    let project: ProjectIn | null;
    if (isId(value)) {
      project = await db.project.findUnique({ where: { id: value }, include: { team: { include: { org: true } } } });
      if (!project) return fail(new ValidationError(field, `${field}: no project with id ${value}`));
    } else {
      const parts = value.split('/');
      if ((parts.length !== 3 && !(parts.length === 1 && within.team)) || parts.some((p) => !p)) {
        const forms = within.team
          ? 'its name in the team, its path org/team/project, or its id'
          : `its path org/team/project, or its id${within.org ? ' (a bare name needs the team too)' : ''}`;
        return fail(new ValidationError(field, `${field}: a project is named by ${forms}; "${value}" is not`));
      }
      let team: TeamIn;
      let name: string;
      if (parts.length === 3) {
        const [orgName, teamName, projectName] = parts as [string, string, string];
        const found = await this.findTeam(db, `${orgName}/${teamName}`, field);
        if (!found.ok) return found;
        team = found.value;
        name = projectName;
      } else {
        team = within.team as TeamIn;
        name = value;
      }
      const p = await db.project.findUnique({ where: { teamId_name: { teamId: team.id, name } } });
      if (!p) return fail(new ValidationError(field, `${field}: team ${teamPath(team)} has no project ${name}`));
      project = { ...p, team };
    }
    if (within.team && project.teamId !== within.team.id) {
      return fail(
        new ValidationError(field, `${field}: project ${projectPath(project)} is not in team ${teamPath(within.team)}`),
      );
    }
    if (within.org && project.team.orgId !== within.org.id) {
      return fail(
        new ValidationError(field, `${field}: project ${projectPath(project)} is not in org ${within.org.name}`),
      );
    }
    return ok(project);
  }

  private async findUser(db: Tx, value: string, field: string): Promise<Result<User, ValidationError>> {
    if (!isId(value) && !value.includes('@')) {
      return fail(new ValidationError(field, `${field}: a user is named by their email or id; "${value}" is neither`));
    }
    const user = await db.user.findUnique({ where: isId(value) ? { id: value } : { email: value.toLowerCase() } });
    if (!user) return fail(new ValidationError(field, `${field}: no user ${value}`));
    if (user.disabledAt) {
      return fail(new ValidationError(field, `${field}: ${user.email} is disabled; enable them first (updateUser)`));
    }
    return ok(user);
  }

  private async findKey(db: Tx, value: string, field: string): Promise<Result<KeyOf, ValidationError>> {
    if (!isId(value)) {
      return fail(
        new ValidationError(field, `${field}: an API token is named by its id (apiTokens lists them), not "${value}"`),
      );
    }
    const key = await db.apiToken.findUnique({ where: { id: value }, include: { user: true } });
    if (!key) return fail(new ValidationError(field, `${field}: no API token with id ${value}`));
    if (key.revokedAt) return fail(new ValidationError(field, `${field}: API token ${keyLabel(key)} is revoked`));
    if (key.expiresAt && key.expiresAt <= new Date()) {
      return fail(new ValidationError(field, `${field}: API token ${keyLabel(key)} has expired`));
    }
    return ok(key);
  }

  // ─── reads for the API ─────────────────────────────────────────────────────────────────────────────────────

  /** The where clause for an org named by name or id (queries take either). */
  orgWhere(value: string): { id: string } | { name: string } {
    return isId(value) ? { id: value } : { name: value };
  }

  // ─── changes (admins) ──────────────────────────────────────────────────────────────────────────────────────

  /** Runs a change under the tree's lock; a refusal returned from inside has written nothing. */
  private change<T>(work: (tx: Tx) => Promise<Result<T>>): Promise<Result<T>> {
    return this.db.$transaction(async (tx) => {
      await lockOrgTree(tx);
      return work(tx);
    });
  }

  async createOrg(ctx: Context, input: unknown): Promise<Result<Org>> {
    const parsed = parseInput(createOrgInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      if (await tx.org.findUnique({ where: { name } }))
        return fail(new ConflictError(`an org named ${name} already exists`));
      const org = await tx.org.create({ data: { name } });
      await this.audit.done(tx, ctx, { action: 'createOrg', target: name });
      return ok(org);
    });
  }

  async createTeam(ctx: Context, input: unknown): Promise<Result<Team>> {
    const parsed = parseInput(createTeamInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const org = await this.findOrg(tx, parsed.value.org, 'org');
      if (!org.ok) return org;
      if (await tx.team.findUnique({ where: { orgId_name: { orgId: org.value.id, name } } })) {
        return fail(new ConflictError(`org ${org.value.name} already has a team ${name}`));
      }
      const team = await tx.team.create({ data: { orgId: org.value.id, name } });
      await this.audit.done(tx, ctx, { action: 'createTeam', target: `${org.value.name}/${name}` });
      return ok(team);
    });
  }

  async createProject(ctx: Context, input: unknown): Promise<Result<Project>> {
    const parsed = parseInput(createProjectInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const team = await this.findTeam(tx, parsed.value.team, 'team');
      if (!team.ok) return team;
      if (await tx.project.findUnique({ where: { teamId_name: { teamId: team.value.id, name } } })) {
        return fail(new ConflictError(`team ${teamPath(team.value)} already has a project ${name}`));
      }
      const project = await tx.project.create({ data: { teamId: team.value.id, name } });
      await this.audit.done(tx, ctx, { action: 'createProject', target: `${teamPath(team.value)}/${name}` });
      return ok(project);
    });
  }

  /**
   * Makes a user or an API token a member of an org, or of a team or project in it. A project's membership
   * records its team too, so the row says the whole place: org, team, project.
   */
  async addMember(ctx: Context, input: unknown): Promise<Result<Membership>> {
    const parsed = parseInput(addMemberInput, input);
    if (!parsed.ok) return parsed;
    const i = parsed.value;
    if (Boolean(i.user) === Boolean(i.apiToken)) {
      return fail(
        new ValidationError(
          'input.user',
          'input.user: a member is a user (input.user: their email or id) or an API token (input.apiToken: its id), one of the two',
        ),
      );
    }
    return this.change(async (tx) => {
      const org = await this.findOrg(tx, i.org, 'input.org');
      if (!org.ok) return org;
      let team: TeamIn | undefined;
      if (i.team) {
        const found = await this.findTeam(tx, i.team, 'input.team', org.value);
        if (!found.ok) return found;
        team = found.value;
      }
      let project: ProjectIn | undefined;
      if (i.project) {
        const found = await this.findProject(tx, i.project, 'input.project', { org: org.value, team });
        if (!found.ok) return found;
        project = found.value;
        team = project.team;
      }
      const place = project ? projectPath(project) : team ? teamPath(team) : org.value.name;
      let who: { userId: string } | { apiTokenId: string };
      let label: string;
      if (i.user) {
        const user = await this.findUser(tx, i.user, 'input.user');
        if (!user.ok) return user;
        who = { userId: user.value.id };
        label = `user ${user.value.email}`;
      } else {
        const key = await this.findKey(tx, i.apiToken as string, 'input.apiToken');
        if (!key.ok) return key;
        who = { apiTokenId: key.value.id };
        label = `API token ${keyLabel(key.value)}`;
      }
      const at = { orgId: org.value.id, teamId: team?.id ?? null, projectId: project?.id ?? null };
      if (await tx.membership.findFirst({ where: { ...at, ...who } })) {
        return fail(new ConflictError(`${label} is already a member of ${place}`));
      }
      const membership = await tx.membership.create({ data: { ...at, ...who } });
      await membersChanged(tx, { id: membership.id });
      await this.audit.done(tx, ctx, { action: 'addMember', target: place, message: label });
      return ok(membership);
    });
  }

  /** Ends a membership; answers with the org it was in, as it is now. */
  async removeMember(ctx: Context, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const m = isId(id) ? await tx.membership.findUnique({ where: { id }, include: memberInclude }) : null;
      if (!m) return fail(new NotFoundError(`no membership with id ${id}`));
      await membersChanged(tx, { id });
      await tx.membership.delete({ where: { id } });
      await this.audit.done(tx, ctx, { action: 'removeMember', target: placeOf(m), message: memberLabel(m) });
      return ok(m.org);
    });
  }

  /** A knowledge base in an org, owned by the org, one of its teams or projects, or one of its members. */
  async createCollection(ctx: Context, input: unknown): Promise<Result<Collection>> {
    const parsed = parseInput(createCollectionInput, input);
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const org = await this.findOrg(tx, parsed.value.org, 'input.org');
      if (!org.ok) return org;
      const owner = await this.lookupOwner(tx, parsed.value.owner, 'input.owner');
      if (!owner.ok) return owner;
      const o = owner.value;
      // Outside the org, its members could not read it (nothing reads across orgs), and neither could the owner.
      if (o.orgId !== null && o.orgId !== org.value.id) {
        return fail(
          new ValidationError(
            'input.owner',
            `input.owner: ${o.label} is not in org ${org.value.name}; a collection there belongs to the org, one of its teams or projects, or one of its members`,
          ),
        );
      }
      if (o.orgId === null) {
        const where = o.scope === 'user' ? { userId: o.id } : { apiTokenId: o.id };
        if (!(await tx.membership.findFirst({ where: { orgId: org.value.id, ...where } }))) {
          return fail(
            new ValidationError(
              'input.owner',
              `input.owner: ${o.label} is not a member of org ${org.value.name}: add them first (addMember)`,
            ),
          );
        }
      }
      if (await tx.collection.findUnique({ where: { orgId_name: { orgId: org.value.id, name } } })) {
        return fail(new ConflictError(`org ${org.value.name} already has a collection ${name}`));
      }
      const c = await tx.collection.create({
        data: { name, orgId: org.value.id, ownerScope: o.scope, ownerId: o.id },
      });
      await this.audit.done(tx, ctx, {
        action: 'createCollection',
        target: name,
        message: `in org ${org.value.name}, owned by ${o.label}`,
      });
      return ok(c);
    });
  }

  /** Deletes a collection's record; answers with its org, as it is now. */
  async deleteCollection(ctx: Context, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const c = isId(id) ? await tx.collection.findUnique({ where: { id }, include: { org: true } }) : null;
      if (!c) return fail(new NotFoundError(`no collection with id ${id}`));
      await tx.collection.delete({ where: { id } });
      const owner = (await this.formatOwners([{ scope: c.ownerScope, id: c.ownerId }], tx)).get(
        `${c.ownerScope}:${c.ownerId}`,
      );
      await this.audit.done(tx, ctx, {
        action: 'deleteCollection',
        target: c.name,
        message: `in org ${c.org.name}, owned by ${owner}`,
      });
      return ok(c.org);
    });
  }

  /** Deletes a project and its memberships; answers with its team, as it is now. */
  async deleteProject(ctx: Context, id: string): Promise<Result<TeamIn>> {
    return this.change(async (tx) => {
      const p = isId(id)
        ? await tx.project.findUnique({ where: { id }, include: { team: { include: { org: true } } } })
        : null;
      if (!p) return fail(new NotFoundError(`no project with id ${id}`));
      const held = await this.holdings(tx, `project ${projectPath(p)}`, { projectIds: [p.id] });
      if (!held.ok) return held;
      const members = await membersChanged(tx, { projectId: p.id });
      await tx.project.delete({ where: { id } });
      await this.audit.done(tx, ctx, {
        action: 'deleteProject',
        target: projectPath(p),
        message: `with ${plural(members, 'membership')}`,
      });
      return ok(p.team);
    });
  }

  /** Deletes a team with its projects and their memberships; answers with its org, as it is now. */
  async deleteTeam(ctx: Context, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const team = isId(id)
        ? await tx.team.findUnique({ where: { id }, include: { org: true, projects: true } })
        : null;
      if (!team) return fail(new NotFoundError(`no team with id ${id}`));
      const held = await this.holdings(tx, `team ${teamPath(team)}`, {
        teamIds: [team.id],
        projectIds: team.projects.map((p) => p.id),
      });
      if (!held.ok) return held;
      // A project's membership records its team too: this counts (and tells) the projects' members as well.
      const members = await membersChanged(tx, { teamId: team.id });
      await tx.team.delete({ where: { id } });
      await this.audit.done(tx, ctx, {
        action: 'deleteTeam',
        target: teamPath(team),
        message: `with ${plural(team.projects.length, 'project')}, ${plural(members, 'membership')}`,
      });
      return ok(team.org);
    });
  }

  /** Deletes an org with its teams, projects and memberships, once it holds no collection and owns nothing. */
  async deleteOrg(ctx: Context, id: string): Promise<Result<{ id: string; name: string }>> {
    return this.change(async (tx) => {
      const org = isId(id)
        ? await tx.org.findUnique({ where: { id }, include: { teams: { include: { projects: true } } } })
        : null;
      if (!org) return fail(new NotFoundError(`no org with id ${id}`));
      const held = await this.holdings(tx, `org ${org.name}`, {
        orgId: org.id,
        teamIds: org.teams.map((t) => t.id),
        projectIds: org.teams.flatMap((t) => t.projects.map((p) => p.id)),
      });
      if (!held.ok) return held;
      const members = await membersChanged(tx, { orgId: org.id });
      const projects = org.teams.reduce((n, t) => n + t.projects.length, 0);
      await tx.org.delete({ where: { id } });
      await this.audit.done(tx, ctx, {
        action: 'deleteOrg',
        target: org.name,
        message: `with ${plural(org.teams.length, 'team')}, ${plural(projects, 'project')}, ${plural(members, 'membership')}`,
      });
      return ok({ id: org.id, name: org.name });
    });
  }

  /**
   * Refuses to delete a part of the tree that still owns something: its collections would be readable by nobody
   * and its adapters or training jobs would name an owner that is gone. The operator deletes those first, on
   * purpose, rather than losing a knowledge base along with a team.
   */
  private async holdings(
    tx: Tx,
    what: string,
    parts: { orgId?: string; teamIds?: string[]; projectIds?: string[] },
  ): Promise<Result<void>> {
    const teamIds = parts.teamIds ?? [];
    const projectIds = parts.projectIds ?? [];
    const keys = [
      ...(parts.orgId ? [`org:${parts.orgId}`] : []),
      ...teamIds.map((id) => `team:${id}`),
      ...projectIds.map((id) => `project:${id}`),
    ];
    const [collections, models, adapters, jobs] = await Promise.all([
      tx.collection.findMany({
        where: {
          OR: [
            ...(parts.orgId ? [{ orgId: parts.orgId }] : []),
            { ownerScope: 'team', ownerId: { in: teamIds } },
            { ownerScope: 'project', ownerId: { in: projectIds } },
          ],
        },
        select: { name: true },
        orderBy: { name: 'asc' },
      }),
      tx.catalogModel.findMany({ where: { owner: { in: keys } }, select: { name: true }, orderBy: { name: 'asc' } }),
      tx.adapter.findMany({ where: { owner: { in: keys } }, select: { name: true }, orderBy: { name: 'asc' } }),
      tx.trainJob.findMany({ where: { owner: { in: keys } }, select: { name: true }, orderBy: { name: 'asc' } }),
    ]);
    const held = [
      ...collections.map((c) => `collection ${c.name}`),
      ...models.map((m) => `model ${m.name}`),
      ...adapters.map((a) => `adapter ${a.name}`),
      ...jobs.map((j) => `training job ${j.name}`),
    ];
    if (!held.length) return ok(undefined);
    const shown = held.slice(0, 5).join(', ') + (held.length > 5 ? ` and ${held.length - 5} more` : '');
    return fail(
      new ConflictError(
        `${what} still holds ${shown}: delete ${held.length > 1 ? 'them' : 'it'} first${models.length ? ' (a model may instead be given another owner with setModelOwner)' : ''}, so nothing is left owned by a part of the tree that is gone`,
      ),
    );
  }
}

/**
 * Tells each user behind these memberships (a member user, or the user of a member API token) that whom their
 * credentials stand for changed: the gateway caches which owners a caller reaches, and live connections check
 * again. Queued in the changing transaction, so it is heard on commit and not at all on a rollback; call it
 * before deleting the rows. Answers how many memberships there were.
 */
async function membersChanged(tx: Tx, where: Prisma.MembershipWhereInput): Promise<number> {
  const rows = await tx.membership.findMany({
    where,
    select: { userId: true, apiToken: { select: { userId: true } } },
  });
  const users = new Set(rows.map((r) => r.userId ?? r.apiToken?.userId).filter((u): u is string => Boolean(u)));
  for (const user of users) await notify(tx, 'credentials', `user:${user}`);
  return rows.length;
}

export function teamPath(team: Team & { org: Pick<Org, 'name'> }): string {
  return `${team.org.name}/${team.name}`;
}

export function projectPath(p: Project & { team: Team & { org: Pick<Org, 'name'> } }): string {
  return `${teamPath(p.team)}/${p.name}`;
}

function keyLabel(key: ApiToken & { user: Pick<User, 'email'> }): string {
  return `${key.name} (${key.user.email})`;
}

function placeOf(m: MemberRow): string {
  return [m.org.name, m.team?.name, m.project?.name].filter(Boolean).join('/');
}

function memberLabel(m: MemberRow): string {
  if (m.user) return `user ${m.user.email}`;
  return m.apiToken ? `API token ${keyLabel(m.apiToken)}` : 'nobody';
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
