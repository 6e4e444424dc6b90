import { tokensByIds, usersByIds } from '../access/access-store.js';
import { roleAtLeast, type Viewer } from '../auth/viewer.js';
import type { Db, Tx } from '../db/client.js';
import type { Collection, Org, User } from '../generated/prisma/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { ok, type Result, type ValidationError } from '../lib/errors.js';
import {
  isId,
  type KeyOf,
  keyLabel,
  lookupOwner,
  type ProjectIn,
  projectPath,
  type TeamIn,
  teamPath,
} from './org-lookup.js';

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
//
// The org service (org.service.ts, the admins' changes to the tree) is given these reads as a part and answers
// them for other domains; finding things by what an operator types is in org-lookup.ts. The table above stays
// beside the code that applies it (reachOf, at the end of this file).

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

/** The owner ids, by scope, whose collections an owner may read: the table above, worked out for one owner. */
export type Reach = Record<OwnerScope, Set<string>>;

/**
 * Whom a caller stands for when it calls or looks (OrgReads.callerReach), and whether it is an admin. What it may
 * call at /v1 is what it may see anywhere else (GraphQL's lists, lookups, subscriptions, the audit log): a name
 * one path hides and another shows is a name confirmed.
 */
export type Sight = { admin: boolean; reach: Reach };

/**
 * THE rule for owned things (a model, an adapter, a training job, an adapter's mirror version, an audit row about
 * one): an owner key ("team:<id>"; null is everyone's) admits a caller that is an admin or whose reach has it.
 * /v1 routes by it, GraphQL shows by it; do not write another.
 */
export function sees(sight: Sight, owner: string | null): boolean {
  if (owner === null || sight.admin) return true;
  const parsed = parseOwnerKey(owner);
  return parsed ? sight.reach[parsed.scope].has(parsed.id) : false;
}

/**
 * The owner keys a sight admits, for SQL (owner IS NULL OR owner = ANY(keys)); undefined for an admin (all). The
 * same rule as `sees`, spelled for a query, so a page of rows is filtered before it is counted and cut.
 */
export function seenOwners(sight: Sight): string[] | undefined {
  if (sight.admin) return undefined;
  return (Object.keys(sight.reach) as OwnerScope[]).flatMap((scope) =>
    [...sight.reach[scope]].map((id) => ownerKey({ scope, id })),
  );
}

/** A sight that sees only what everyone may: for callers outside the tree (a node, an anonymous caller). */
export function publicSight(): Sight {
  return {
    admin: false,
    reach: { org: new Set(), team: new Set(), project: new Set(), user: new Set(), key: new Set() },
  };
}

// Every change to the tree takes this lock in its transaction, so the checks it makes (a team owns nothing, an
// owner is inside the org) still hold when it commits, also with several server replicas.
const ORG_LOCK = 0x6f726773; // 'orgs'

/** Takes the org tree's lock in a transaction that stores an owner, so the owner cannot be deleted meanwhile. */
export async function lockOrgTree(tx: Tx) {
  await tx.$executeRaw`SELECT pg_advisory_xact_lock(${ORG_LOCK})`;
}

export type OrgReadsDeps = { db: Db };

export class OrgReads {
  private readonly db: Db;

  constructor({ db }: OrgReadsDeps) {
    this.db = db;
  }

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
    const found = await lookupOwner(opts.db ?? this.db, owner, opts.field ?? 'owner');
    if (!found.ok) return found;
    const { scope, id, label } = found.value;
    return ok({ scope, id, label });
  }

  /** The ids of every collection `owner` may read (the table at the top of this file). */
  async readableCollections(owner: OwnerRef, db: Tx = this.db): Promise<Set<string>> {
    const reach = await reachOf(db, owner);
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
    return (await reachOf(db, owner))[c.ownerScope].has(c.ownerId);
  }

  /**
   * Whether `caller` (a user, or an API token as a key of its own) is among those who may read what `owner` owns:
   * the readers a collection owned by `owner` would have. This is who may read an owned job's pairs and
   * artifacts and fetch an owned adapter: what was trained on the owner's collections says what they say.
   */
  async admits(owner: OwnerRef, caller: OwnerRef, db: Tx = this.db): Promise<boolean> {
    if (!isId(owner.id) || !isId(caller.id)) return false;
    return (await reachOf(db, caller))[owner.scope].has(owner.id);
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
      reachOf(db, { scope: 'user', id: caller.userId }),
      caller.tokenId ? reachOf(db, { scope: 'key', id: caller.tokenId }) : undefined,
    ]);
    if (key) for (const scope of Object.keys(user) as OwnerScope[]) for (const id of key[scope]) user[scope].add(id);
    return user;
  }

  /**
   * What a viewer may see and call of owned things (`sees`): an admin everything; a session its user's reach; an
   * API token its user's and its own (callerReach, as at /v1). Hangar's own passes see all; nodes and anonymous
   * callers only what is everyone's (a node fetches what it loads through /mirror, which asks it otherwise).
   * `reachOf` is where the reach comes from: the gateway passes its kept copy (gateway/callers.ts).
   */
  async sightOf(
    viewer: Viewer,
    reachOf: (userId: string, tokenId: string | undefined) => Promise<Reach> = (userId, tokenId) =>
      this.callerReach({ userId, tokenId }),
  ): Promise<Sight> {
    if (viewer.kind === 'system') return { ...publicSight(), admin: true };
    if (viewer.kind !== 'user' && viewer.kind !== 'token') return publicSight();
    if (roleAtLeast(viewer.role, 'ADMIN')) return { ...publicSight(), admin: true };
    return { admin: false, reach: await reachOf(viewer.user.id, viewer.kind === 'token' ? viewer.tokenId : undefined) };
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
      usersByIds(db, ids('user')),
      tokensByIds(db, ids('key')),
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

  // ─── reads for the API ─────────────────────────────────────────────────────────────────────────────────────

  /** The where clause for an org named by name or id (queries take either). */
  orgWhere(value: string): { id: string } | { name: string } {
    return isId(value) ? { id: value } : { name: value };
  }
}

/** The table at the top of this file, worked out for one owner: whose collections it may read. */
async function reachOf(db: Tx, owner: OwnerRef): Promise<Reach> {
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
