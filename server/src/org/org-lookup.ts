import { tokenById, userByEmail, userById } from '../access/access-store.js';
import type { Tx } from '../db/client.js';
import type { ApiToken, Membership, Org, Project, Team, User } from '../generated/prisma/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import type { ResolvedOwner } from './org-owners.js';

// Finding the organisation's things by what an operator types: an org by name, a team by its path org/team, an
// owner as "team:acme/research". Each takes the transaction it reads in (a change reads under the tree's lock),
// and a refusal is a ValidationError on the field the operator filled, saying which forms are accepted.

export const OWNER_FORMS =
  'org:<name or id>, team:<org/team or id>, project:<org/team/project or id>, user:<email or id> or key:<API token id>';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
export const isId = (s: string) => UUID.test(s);

export type TeamIn = Team & { org: Org };
export type ProjectIn = Project & { team: TeamIn };
export type KeyOf = ApiToken & { user: User };
export type Looked = ResolvedOwner & { orgId: string | null };
export type MemberRow = Membership & {
  org: Org;
  team: Team | null;
  project: Project | null;
  user: User | null;
  apiToken: KeyOf | null;
};

export function teamPath(team: Team & { org: Pick<Org, 'name'> }): string {
  return `${team.org.name}/${team.name}`;
}

export function projectPath(p: Project & { team: Team & { org: Pick<Org, 'name'> } }): string {
  return `${teamPath(p.team)}/${p.name}`;
}

export function keyLabel(key: ApiToken & { user: Pick<User, 'email'> }): string {
  return `${key.name} (${key.user.email})`;
}

/**
 * An owner as an operator writes it (OWNER_FORMS), with the org it is in (null for a user or a key, who may be
 * in several). Disabled users and revoked or expired keys are refused: nobody could use what they would own.
 */
export async function lookupOwner(db: Tx, owner: string, field: string): Promise<Result<Looked, ValidationError>> {
  const m = /^(org|team|project|user|key):(.+)$/.exec(owner.trim());
  if (!m) return fail(new ValidationError(field, `${field}: an owner is ${OWNER_FORMS}; "${owner}" is not`));
  const scope = m[1] as OwnerScope;
  const value = (m[2] as string).trim();
  switch (scope) {
    case 'org': {
      const org = await findOrg(db, value, field);
      return org.ok ? ok({ scope, id: org.value.id, label: `org:${org.value.name}`, orgId: org.value.id }) : org;
    }
    case 'team': {
      const team = await findTeam(db, value, field);
      return team.ok
        ? ok({ scope, id: team.value.id, label: `team:${teamPath(team.value)}`, orgId: team.value.orgId })
        : team;
    }
    case 'project': {
      const p = await findProject(db, value, field);
      return p.ok
        ? ok({ scope, id: p.value.id, label: `project:${projectPath(p.value)}`, orgId: p.value.team.orgId })
        : p;
    }
    case 'user': {
      const user = await findUser(db, value, field);
      return user.ok ? ok({ scope, id: user.value.id, label: `user:${user.value.email}`, orgId: null }) : user;
    }
    case 'key': {
      const key = await findKey(db, value, field);
      return key.ok ? ok({ scope, id: key.value.id, label: `key:${keyLabel(key.value)}`, orgId: null }) : key;
    }
  }
}

/** An org by name or id. */
export async function findOrg(db: Tx, value: string, field: string): Promise<Result<Org, ValidationError>> {
  const org = await db.org.findUnique({ where: isId(value) ? { id: value } : { name: value } });
  if (!org) return fail(new ValidationError(field, `${field}: no org ${value} (an org is named by its name or id)`));
  return ok(org);
}

/** A team by id or path org/team; a bare name when `within` says which org. */
export async function findTeam(
  db: Tx,
  value: string,
  field: string,
  within?: Org,
): Promise<Result<TeamIn, ValidationError>> {
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
export async function findProject(
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
      const found = await findTeam(db, `${orgName}/${teamName}`, field);
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

/** A user by email or id; a disabled one is refused (enable them first). */
export async function findUser(db: Tx, value: string, field: string): Promise<Result<User, ValidationError>> {
  if (!isId(value) && !value.includes('@')) {
    return fail(new ValidationError(field, `${field}: a user is named by their email or id; "${value}" is neither`));
  }
  const user = isId(value) ? await userById(db, value) : await userByEmail(db, value.toLowerCase());
  if (!user) return fail(new ValidationError(field, `${field}: no user ${value}`));
  if (user.disabledAt) {
    return fail(new ValidationError(field, `${field}: ${user.email} is disabled; enable them first (updateUser)`));
  }
  return ok(user);
}

/** An API token by id; a revoked or expired one is refused. */
export async function findKey(db: Tx, value: string, field: string): Promise<Result<KeyOf, ValidationError>> {
  if (!isId(value)) {
    return fail(
      new ValidationError(field, `${field}: an API token is named by its id (apiTokens lists them), not "${value}"`),
    );
  }
  const key = await tokenById(db, value);
  if (!key) return fail(new ValidationError(field, `${field}: no API token with id ${value}`));
  if (key.revokedAt) return fail(new ValidationError(field, `${field}: API token ${keyLabel(key)} is revoked`));
  if (key.expiresAt && key.expiresAt <= new Date()) {
    return fail(new ValidationError(field, `${field}: API token ${keyLabel(key)} has expired`));
  }
  return ok(key);
}
