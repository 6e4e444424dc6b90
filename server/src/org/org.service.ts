import { z } from 'zod';
import { tokensByIds } from '../access/access-store.js';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import { heldBy } from '../catalog/catalog-store.js';
import type { Db, Tx } from '../db/client.js';
import type { Collection, Membership, Org, Prisma, Project, Team } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { resourceName } from '../lib/names.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { jobsHeldBy } from '../train/train-store.js';
import {
  findKey,
  findOrg,
  findProject,
  findTeam,
  findUser,
  isId,
  keyLabel,
  lookupOwner,
  type MemberRow,
  OWNER_FORMS,
  type ProjectIn,
  projectPath,
  type TeamIn,
  teamPath,
} from './org-lookup.js';
import { lockOrgTree, OrgReads } from './org-owners.js';

// The organisation tree's changes, made by admins: orgs, teams, projects, memberships and collections, each
// under the tree's lock. Owners and who may read what are a part of their own (OrgReads, org-owners.ts), which
// this service is given and answers for: other domains ask `org.mayRead`, `org.sightOf`, … of this one object.

export { projectPath, teamPath } from './org-lookup.js';
export type { OwnerRef, Reach, ResolvedOwner, Sight } from './org-owners.js';
export {
  lockOrgTree,
  ownerKey,
  parseOwnerKey,
  publicSight,
  seenOwners,
  sees,
} from './org-owners.js';

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

const renameInput = z.object({ id: ref('the id'), name: entityName('the new name') });

/**
 * What removing a part of the tree would do, shown before an operator confirms: what it still owns (the removal is
 * refused until those are gone or given another owner), and the teams, projects and members that go with it.
 */
export type Removal = {
  what: string;
  collections: string[];
  models: string[];
  adapters: string[];
  trainJobs: string[];
  teams: string[];
  projects: string[];
  /** Memberships that end, as "user:alice@example.com at acme/support". */
  members: string[];
  /** The API tokens among those members: what their scripts may call narrows at once. */
  apiTokens: string[];
};

type Parts = { orgId?: string; teamIds?: string[]; projectIds?: string[] };

const memberInclude = {
  org: true,
  team: true,
  project: true,
  user: true,
  apiToken: { include: { user: true } },
} as const;

export type OrgDeps = { db: Db; audit: AuditService };

export class OrgService {
  private readonly db: Db;
  private readonly audit: AuditService;
  /** Owners and who may read what: the reads below are its, answered here for other domains and the schema. */
  private readonly reads: OrgReads;

  constructor({ db, audit }: OrgDeps) {
    this.db = db;
    this.audit = audit;
    this.reads = new OrgReads({ db });
  }

  // ─── owners and readability (OrgReads, org-owners.ts) ──────────────────────────────────────────────────────

  resolveOwner(...a: Parameters<OrgReads['resolveOwner']>) {
    return this.reads.resolveOwner(...a);
  }
  readableCollections(...a: Parameters<OrgReads['readableCollections']>) {
    return this.reads.readableCollections(...a);
  }
  collection(...a: Parameters<OrgReads['collection']>) {
    return this.reads.collection(...a);
  }
  canRead(...a: Parameters<OrgReads['canRead']>) {
    return this.reads.canRead(...a);
  }
  admits(...a: Parameters<OrgReads['admits']>) {
    return this.reads.admits(...a);
  }
  mayRead(...a: Parameters<OrgReads['mayRead']>) {
    return this.reads.mayRead(...a);
  }
  callerReach(...a: Parameters<OrgReads['callerReach']>) {
    return this.reads.callerReach(...a);
  }
  sightOf(...a: Parameters<OrgReads['sightOf']>) {
    return this.reads.sightOf(...a);
  }
  formatOwner(...a: Parameters<OrgReads['formatOwner']>) {
    return this.reads.formatOwner(...a);
  }
  formatOwners(...a: Parameters<OrgReads['formatOwners']>) {
    return this.reads.formatOwners(...a);
  }
  orgWhere(...a: Parameters<OrgReads['orgWhere']>) {
    return this.reads.orgWhere(...a);
  }

  // ─── changes (admins) ──────────────────────────────────────────────────────────────────────────────────────

  /** Runs a change under the tree's lock; a refusal returned from inside has written nothing. */
  private change<T>(work: (tx: Tx) => Promise<Result<T>>): Promise<Result<T>> {
    return this.db.$transaction(async (tx) => {
      await lockOrgTree(tx);
      return work(tx);
    });
  }

  async createOrg(actor: Actor, input: z.input<typeof createOrgInput>): Promise<Result<Org>> {
    const parsed = parseInput(createOrgInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      if (await tx.org.findUnique({ where: { name } }))
        return fail(new ConflictError(`an org named ${name} already exists`));
      const org = await tx.org.create({ data: { name } });
      await this.audit.done(tx, actor, { action: 'createOrg', target: name });
      return ok(org);
    });
  }

  async createTeam(actor: Actor, input: z.input<typeof createTeamInput>): Promise<Result<Team>> {
    const parsed = parseInput(createTeamInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const org = await findOrg(tx, parsed.value.org, 'org');
      if (!org.ok) return org;
      if (await tx.team.findUnique({ where: { orgId_name: { orgId: org.value.id, name } } })) {
        return fail(new ConflictError(`org ${org.value.name} already has a team ${name}`));
      }
      const team = await tx.team.create({ data: { orgId: org.value.id, name } });
      await this.audit.done(tx, actor, { action: 'createTeam', target: `${org.value.name}/${name}` });
      return ok(team);
    });
  }

  async createProject(actor: Actor, input: z.input<typeof createProjectInput>): Promise<Result<Project>> {
    const parsed = parseInput(createProjectInput, input, '');
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const team = await findTeam(tx, parsed.value.team, 'team');
      if (!team.ok) return team;
      if (await tx.project.findUnique({ where: { teamId_name: { teamId: team.value.id, name } } })) {
        return fail(new ConflictError(`team ${teamPath(team.value)} already has a project ${name}`));
      }
      const project = await tx.project.create({ data: { teamId: team.value.id, name } });
      await this.audit.done(tx, actor, { action: 'createProject', target: `${teamPath(team.value)}/${name}` });
      return ok(project);
    });
  }

  /**
   * Makes a user or an API token a member of an org, or of a team or project in it. A project's membership
   * records its team too, so the row says the whole place: org, team, project.
   */
  async addMember(actor: Actor, input: z.input<typeof addMemberInput>): Promise<Result<Membership>> {
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
      const org = await findOrg(tx, i.org, 'input.org');
      if (!org.ok) return org;
      let team: TeamIn | undefined;
      if (i.team) {
        const found = await findTeam(tx, i.team, 'input.team', org.value);
        if (!found.ok) return found;
        team = found.value;
      }
      let project: ProjectIn | undefined;
      if (i.project) {
        const found = await findProject(tx, i.project, 'input.project', { org: org.value, team });
        if (!found.ok) return found;
        project = found.value;
        team = project.team;
      }
      const place = project ? projectPath(project) : team ? teamPath(team) : org.value.name;
      let who: { userId: string } | { apiTokenId: string };
      let label: string;
      if (i.user) {
        const user = await findUser(tx, i.user, 'input.user');
        if (!user.ok) return user;
        who = { userId: user.value.id };
        label = `user ${user.value.email}`;
      } else {
        const key = await findKey(tx, i.apiToken as string, 'input.apiToken');
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
      await this.audit.done(tx, actor, { action: 'addMember', target: place, message: label });
      return ok(membership);
    });
  }

  /** Ends a membership; answers with the org it was in, as it is now. */
  async removeMember(actor: Actor, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const m = isId(id) ? await tx.membership.findUnique({ where: { id }, include: memberInclude }) : null;
      if (!m) return fail(new NotFoundError(`no membership with id ${id}`));
      await membersChanged(tx, { id });
      await tx.membership.delete({ where: { id } });
      await this.audit.done(tx, actor, { action: 'removeMember', target: placeOf(m), message: memberLabel(m) });
      return ok(m.org);
    });
  }

  // Renames: owners are stored by id, so what a team owns stays its own and every page shows the new name at once.

  async renameOrg(actor: Actor, input: z.input<typeof renameInput>): Promise<Result<Org>> {
    return this.rename(actor, input, 'renameOrg', async (tx, id, name) => {
      const org = isId(id) ? await tx.org.findUnique({ where: { id } }) : null;
      if (!org) return fail(new NotFoundError(`no org with id ${id}`));
      if (org.name !== name && (await tx.org.findUnique({ where: { name } }))) {
        return fail(new ConflictError(`an org named ${name} already exists`));
      }
      return ok({ before: org.name, after: name, row: await tx.org.update({ where: { id }, data: { name } }) });
    });
  }

  async renameTeam(actor: Actor, input: z.input<typeof renameInput>): Promise<Result<Team>> {
    return this.rename(actor, input, 'renameTeam', async (tx, id, name) => {
      const team = isId(id) ? await tx.team.findUnique({ where: { id }, include: { org: true } }) : null;
      if (!team) return fail(new NotFoundError(`no team with id ${id}`));
      if (team.name !== name && (await tx.team.findUnique({ where: { orgId_name: { orgId: team.orgId, name } } }))) {
        return fail(new ConflictError(`org ${team.org.name} already has a team ${name}`));
      }
      const row = await tx.team.update({ where: { id }, data: { name } });
      return ok({ before: teamPath(team), after: `${team.org.name}/${name}`, row });
    });
  }

  async renameProject(actor: Actor, input: z.input<typeof renameInput>): Promise<Result<Project>> {
    return this.rename(actor, input, 'renameProject', async (tx, id, name) => {
      const p = isId(id)
        ? await tx.project.findUnique({ where: { id }, include: { team: { include: { org: true } } } })
        : null;
      if (!p) return fail(new NotFoundError(`no project with id ${id}`));
      if (p.name !== name && (await tx.project.findUnique({ where: { teamId_name: { teamId: p.teamId, name } } }))) {
        return fail(new ConflictError(`team ${teamPath(p.team)} already has a project ${name}`));
      }
      const row = await tx.project.update({ where: { id }, data: { name } });
      return ok({ before: projectPath(p), after: `${teamPath(p.team)}/${name}`, row });
    });
  }

  async renameCollection(actor: Actor, input: z.input<typeof renameInput>): Promise<Result<Collection>> {
    return this.rename(actor, input, 'renameCollection', async (tx, id, name) => {
      const c = isId(id) ? await tx.collection.findUnique({ where: { id }, include: { org: true } }) : null;
      if (!c) return fail(new NotFoundError(`no collection with id ${id}`));
      if (c.name !== name && (await tx.collection.findUnique({ where: { orgId_name: { orgId: c.orgId, name } } }))) {
        return fail(new ConflictError(`org ${c.org.name} already has a collection ${name}`));
      }
      const row = await tx.collection.update({ where: { id }, data: { name } });
      return ok({ before: `${c.org.name}/${c.name}`, after: `${c.org.name}/${name}`, row });
    });
  }

  private async rename<T>(
    actor: Actor,
    input: z.input<typeof renameInput>,
    action: string,
    work: (tx: Tx, id: string, name: string) => Promise<Result<{ before: string; after: string; row: T }>>,
  ): Promise<Result<T>> {
    const parsed = parseInput(renameInput, input, '');
    if (!parsed.ok) return parsed;
    return this.change(async (tx) => {
      const done = await work(tx, parsed.value.id, parsed.value.name);
      if (!done.ok) return done;
      await this.audit.done(tx, actor, {
        action,
        target: done.value.before,
        message: `renamed to ${done.value.after}`,
      });
      return ok(done.value.row);
    });
  }

  /** What removing an org, a team or a project would do (Removal); null when there is no such thing. */
  async removal(kind: 'org' | 'team' | 'project', id: string): Promise<Removal | null> {
    if (!isId(id)) return null;
    const db = this.db;
    if (kind === 'org') {
      const org = await db.org.findUnique({ where: { id }, include: { teams: { include: { projects: true } } } });
      if (!org) return null;
      return this.removalOf(db, `org ${org.name}`, {
        orgId: org.id,
        teamIds: org.teams.map((t) => t.id),
        projectIds: org.teams.flatMap((t) => t.projects.map((p) => p.id)),
      });
    }
    if (kind === 'team') {
      const team = await db.team.findUnique({ where: { id }, include: { org: true, projects: true } });
      if (!team) return null;
      return this.removalOf(db, `team ${teamPath(team)}`, {
        teamIds: [team.id],
        projectIds: team.projects.map((p) => p.id),
      });
    }
    const p = await db.project.findUnique({ where: { id }, include: { team: { include: { org: true } } } });
    if (!p) return null;
    return this.removalOf(db, `project ${projectPath(p)}`, { projectIds: [p.id] });
  }

  private async removalOf(tx: Tx, what: string, parts: Parts): Promise<Removal> {
    const teamIds = parts.teamIds ?? [];
    const projectIds = parts.projectIds ?? [];
    const owned = await this.ownedBy(tx, parts);
    const [teams, projects, memberships] = await Promise.all([
      parts.orgId
        ? tx.team.findMany({ where: { id: { in: teamIds } }, include: { org: true }, orderBy: { name: 'asc' } })
        : Promise.resolve([]),
      tx.project.findMany({
        where: { id: { in: projectIds } },
        include: { team: { include: { org: true } } },
        orderBy: { name: 'asc' },
      }),
      tx.membership.findMany({
        where: parts.orgId
          ? { orgId: parts.orgId }
          : teamIds.length
            ? { teamId: { in: teamIds } }
            : { projectId: { in: projectIds } },
        include: memberInclude,
        orderBy: { createdAt: 'asc' },
      }),
    ]);
    return {
      what,
      ...owned,
      teams: teams.map(teamPath),
      projects: projects.map(projectPath),
      members: memberships.map((m) => `${memberKey(m)} at ${placeOf(m)}`),
      apiTokens: [...new Set(memberships.flatMap((m) => (m.apiToken ? [keyLabel(m.apiToken)] : [])))],
    };
  }

  /** A knowledge base in an org, owned by the org, one of its teams or projects, or one of its members. */
  async createCollection(actor: Actor, input: z.input<typeof createCollectionInput>): Promise<Result<Collection>> {
    const parsed = parseInput(createCollectionInput, input);
    if (!parsed.ok) return parsed;
    const { name } = parsed.value;
    return this.change(async (tx) => {
      const org = await findOrg(tx, parsed.value.org, 'input.org');
      if (!org.ok) return org;
      const owner = await lookupOwner(tx, parsed.value.owner, 'input.owner');
      if (!owner.ok) return owner;
      const found = owner.value;
      // Outside the org, its members could not read it (nothing reads across orgs), and neither could the owner.
      if (found.orgId !== null && found.orgId !== org.value.id) {
        return fail(
          new ValidationError(
            'input.owner',
            `input.owner: ${found.label} is not in org ${org.value.name}; a collection there belongs to the org, one of its teams or projects, or one of its members`,
          ),
        );
      }
      if (found.orgId === null) {
        const where = found.scope === 'user' ? { userId: found.id } : { apiTokenId: found.id };
        if (!(await tx.membership.findFirst({ where: { orgId: org.value.id, ...where } }))) {
          return fail(
            new ValidationError(
              'input.owner',
              `input.owner: ${found.label} is not a member of org ${org.value.name}: add them first (addMember)`,
            ),
          );
        }
      }
      if (await tx.collection.findUnique({ where: { orgId_name: { orgId: org.value.id, name } } })) {
        return fail(new ConflictError(`org ${org.value.name} already has a collection ${name}`));
      }
      const c = await tx.collection.create({
        data: { name, orgId: org.value.id, ownerScope: found.scope, ownerId: found.id },
      });
      await this.audit.done(tx, actor, {
        action: 'createCollection',
        target: name,
        message: `in org ${org.value.name}, owned by ${found.label}`,
      });
      return ok(c);
    });
  }

  /** Deletes a collection's record; answers with its org, as it is now. */
  async deleteCollection(actor: Actor, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const c = isId(id) ? await tx.collection.findUnique({ where: { id }, include: { org: true } }) : null;
      if (!c) return fail(new NotFoundError(`no collection with id ${id}`));
      await tx.collection.delete({ where: { id } });
      const owner = (await this.reads.formatOwners([{ scope: c.ownerScope, id: c.ownerId }], tx)).get(
        `${c.ownerScope}:${c.ownerId}`,
      );
      await this.audit.done(tx, actor, {
        action: 'deleteCollection',
        target: c.name,
        message: `in org ${c.org.name}, owned by ${owner}`,
      });
      return ok(c.org);
    });
  }

  /** Deletes a project and its memberships; answers with its team, as it is now. */
  async deleteProject(actor: Actor, id: string): Promise<Result<TeamIn>> {
    return this.change(async (tx) => {
      const p = isId(id)
        ? await tx.project.findUnique({ where: { id }, include: { team: { include: { org: true } } } })
        : null;
      if (!p) return fail(new NotFoundError(`no project with id ${id}`));
      const holdings = await this.holdings(tx, `project ${projectPath(p)}`, { projectIds: [p.id] });
      if (!holdings.ok) return holdings;
      const members = await membersChanged(tx, { projectId: p.id });
      await tx.project.delete({ where: { id } });
      await this.audit.done(tx, actor, {
        action: 'deleteProject',
        target: projectPath(p),
        message: `with ${plural(members, 'membership')}`,
      });
      return ok(p.team);
    });
  }

  /** Deletes a team with its projects and their memberships; answers with its org, as it is now. */
  async deleteTeam(actor: Actor, id: string): Promise<Result<Org>> {
    return this.change(async (tx) => {
      const team = isId(id)
        ? await tx.team.findUnique({ where: { id }, include: { org: true, projects: true } })
        : null;
      if (!team) return fail(new NotFoundError(`no team with id ${id}`));
      const holdings = await this.holdings(tx, `team ${teamPath(team)}`, {
        teamIds: [team.id],
        projectIds: team.projects.map((p) => p.id),
      });
      if (!holdings.ok) return holdings;
      // A project's membership records its team too: this counts (and tells) the projects' members as well.
      const members = await membersChanged(tx, { teamId: team.id });
      await tx.team.delete({ where: { id } });
      await this.audit.done(tx, actor, {
        action: 'deleteTeam',
        target: teamPath(team),
        message: `with ${plural(team.projects.length, 'project')}, ${plural(members, 'membership')}`,
      });
      return ok(team.org);
    });
  }

  /** Deletes an org with its teams, projects and memberships, once it holds no collection and owns nothing. */
  async deleteOrg(actor: Actor, id: string): Promise<Result<{ id: string; name: string }>> {
    return this.change(async (tx) => {
      const org = isId(id)
        ? await tx.org.findUnique({ where: { id }, include: { teams: { include: { projects: true } } } })
        : null;
      if (!org) return fail(new NotFoundError(`no org with id ${id}`));
      const holdings = await this.holdings(tx, `org ${org.name}`, {
        orgId: org.id,
        teamIds: org.teams.map((t) => t.id),
        projectIds: org.teams.flatMap((t) => t.projects.map((p) => p.id)),
      });
      if (!holdings.ok) return holdings;
      const members = await membersChanged(tx, { orgId: org.id });
      const projects = org.teams.reduce((n, t) => n + t.projects.length, 0);
      await tx.org.delete({ where: { id } });
      await this.audit.done(tx, actor, {
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
  private async holdings(tx: Tx, what: string, parts: Parts): Promise<Result<void>> {
    const { collections, models, adapters, trainJobs: jobs } = await this.ownedBy(tx, parts);
    const stillOwned = [
      ...collections.map((c) => `collection ${c}`),
      ...models.map((m) => `model ${m}`),
      ...adapters.map((a) => `adapter ${a}`),
      ...jobs.map((j) => `training job ${j}`),
    ];
    if (!stillOwned.length) return ok(undefined);
    const shown =
      stillOwned.slice(0, 5).join(', ') + (stillOwned.length > 5 ? ` and ${stillOwned.length - 5} more` : '');
    return fail(
      new ConflictError(
        `${what} still holds ${shown}: delete ${stillOwned.length > 1 ? 'them' : 'it'} first${models.length ? ' (a model may instead be given another owner with setModelOwner)' : ''}, so nothing is left owned by a part of the tree that is gone`,
      ),
    );
  }

  /** The collections, models, adapters and training jobs a part of the tree owns, by name. */
  private async ownedBy(
    tx: Tx,
    parts: Parts,
  ): Promise<{ collections: string[]; models: string[]; adapters: string[]; trainJobs: string[] }> {
    const teamIds = parts.teamIds ?? [];
    const projectIds = parts.projectIds ?? [];
    const keys = [
      ...(parts.orgId ? [`org:${parts.orgId}`] : []),
      ...teamIds.map((id) => `team:${id}`),
      ...projectIds.map((id) => `project:${id}`),
    ];
    const [collections, catalog, jobs] = await Promise.all([
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
      heldBy(tx, keys),
      jobsHeldBy(tx, keys),
    ]);
    return {
      collections: collections.map((c) => c.name),
      models: catalog.models,
      adapters: catalog.adapters,
      trainJobs: jobs,
    };
  }
}

/**
 * Tells each user behind these memberships (a member user, or the user of a member API token) that whom their
 * credentials stand for changed: the gateway caches which owners a caller reaches, and live connections check
 * again. Queued in the changing transaction, so it is heard on commit and not at all on a rollback; call it
 * before deleting the rows. Answers how many memberships there were.
 */
async function membersChanged(tx: Tx, where: Prisma.MembershipWhereInput): Promise<number> {
  const rows = await tx.membership.findMany({ where, select: { userId: true, apiTokenId: true } });
  // A member key's user, from access (which owns the tokens).
  const keys = new Map(
    (
      await tokensByIds(
        tx,
        rows.flatMap((r) => (r.apiTokenId ? [r.apiTokenId] : [])),
      )
    ).map((k) => [k.id, k.userId]),
  );
  const users = new Set(
    rows.map((r) => r.userId ?? (r.apiTokenId ? keys.get(r.apiTokenId) : null)).filter((u): u is string => Boolean(u)),
  );
  for (const user of users) await notify(tx, 'credentials', `user:${user}`);
  return rows.length;
}

function placeOf(m: MemberRow): string {
  return [m.org.name, m.team?.name, m.project?.name].filter(Boolean).join('/');
}

/** A member as owners are written: "user:alice@example.com", "key:ci-deploy (alice@example.com)". */
function memberKey(m: MemberRow): string {
  if (m.user) return `user:${m.user.email}`;
  return m.apiToken ? `key:${keyLabel(m.apiToken)}` : 'nobody';
}

function memberLabel(m: MemberRow): string {
  if (m.user) return `user ${m.user.email}`;
  return m.apiToken ? `API token ${keyLabel(m.apiToken)}` : 'nobody';
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
