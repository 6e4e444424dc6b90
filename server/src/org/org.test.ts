import { randomBytes } from 'node:crypto';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import type { Viewer } from '../auth/viewer.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import { type Listener, listen, makePubSub, notify } from '../pubsub.js';
import type { OrgService } from './org.service.js';
import { ownerKey, parseOwnerKey } from './org.service.js';

let t: TestApp;
let admin: string;
let operator: string;
let viewer: string;
let org: OrgService;
const db = () => t.app.db.prisma;

beforeAll(async () => {
  t = await startTestApp();
  admin = await t.token('ADMIN', 'org-admin');
  operator = await t.token('OPERATOR', 'org-operator');
  viewer = await t.token('VIEWER', 'org-viewer');
  org = t.app.services.org;
});
afterAll(() => t.close());

const ERR = '__typename ... on Error { message code } ... on ValidationError { field }';
// Deleting takes an id only: there is nothing to validate, so no ValidationError in those unions.
const GONE = '__typename ... on Error { message code }';
const Q = {
  createOrg: `mutation($name: String!) { createOrg(name: $name) { ${ERR} ... on Org { id name } } }`,
  deleteOrg: `mutation($id: ID!) { deleteOrg(id: $id) { ${GONE} ... on RemovedOrg { id name } } }`,
  createTeam: `mutation($org: String!, $name: String!) { createTeam(org: $org, name: $name) { ${ERR} ... on Team { id name path org { name } } } }`,
  deleteTeam: `mutation($id: ID!) { deleteTeam(id: $id) { ${GONE} ... on Org { name teams { name } } } }`,
  createProject: `mutation($team: String!, $name: String!) { createProject(team: $team, name: $name) { ${ERR} ... on Project { id name path team { path } } } }`,
  deleteProject: `mutation($id: ID!) { deleteProject(id: $id) { ${GONE} ... on Team { path projects { name } } } }`,
  addMember: `mutation($i: AddMemberInput!) { addMember(input: $i) { ${ERR} ... on Membership { id place member team { name } project { name } } } }`,
  removeMember: `mutation($id: ID!) { removeMember(id: $id) { ${GONE} ... on Org { name members { id } } } }`,
  createCollection: `mutation($i: CreateCollectionInput!) { createCollection(input: $i) { ${ERR} ... on Collection { id name owner ownerScope ownerId org { name } } } }`,
  deleteCollection: `mutation($id: ID!) { deleteCollection(id: $id) { ${GONE} ... on Org { name collections { name } } } }`,
};
type Name = keyof typeof Q;

/** Runs one of the org mutations as the admin (or another caller) and returns its result. */
async function run(name: Name, variables: Record<string, unknown>, token = admin) {
  const r = await t.gql(Q[name], variables, { token });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data?.[name];
}

/** Runs a mutation that must succeed, and checks it left one DONE audit event. */
async function done(name: Name, variables: Record<string, unknown>) {
  const since = await lastAuditId();
  const result = await run(name, variables);
  expect(result.__typename, JSON.stringify(result)).not.toMatch(/Error$/);
  const events = await db().auditEvent.findMany({ where: { id: { gt: since } } });
  expect(events).toMatchObject([{ action: name, outcome: 'DONE', actor: 'token:org-admin (admin@example.com)' }]);
  return result;
}

const lastAuditId = async () => (await db().auditEvent.aggregate({ _max: { id: true } }))._max.id ?? 0n;
const counts = async () => ({
  orgs: await db().org.count(),
  teams: await db().team.count(),
  projects: await db().project.count(),
  memberships: await db().membership.count(),
  collections: await db().collection.count(),
});

/** Runs a mutation that must be refused: nothing changes but one REFUSED audit event. */
async function refused(name: Name, variables: Record<string, unknown>, token = admin) {
  const before = await counts();
  const since = await lastAuditId();
  const result = await run(name, variables, token);
  expect(result.__typename, JSON.stringify(result)).toMatch(/Error$/);
  expect(await counts()).toEqual(before);
  const events = await db().auditEvent.findMany({ where: { id: { gt: since } } });
  expect(events).toMatchObject([{ action: name, outcome: 'REFUSED', message: result.message }]);
  return result;
}

async function user(email: string) {
  return db().user.create({ data: { email, name: email.split('@')[0] as string, role: 'VIEWER', passwordHash: 'x' } });
}
async function key(name: string, userId: string, extra: { revokedAt?: Date; expiresAt?: Date } = {}) {
  return db().apiToken.create({
    data: { name, prefix: 'hgr_test', tokenHash: randomBytes(16).toString('hex'), role: 'VIEWER', userId, ...extra },
  });
}

describe('the org tree', () => {
  it('creates orgs, teams and projects, each audited with its path', async () => {
    const o = await done('createOrg', { name: 'tree' });
    expect(o).toMatchObject({ __typename: 'Org', name: 'tree' });
    const team = await done('createTeam', { org: 'tree', name: 'research' });
    expect(team).toMatchObject({ name: 'research', path: 'tree/research', org: { name: 'tree' } });
    // By id as well as by name and path.
    await done('createTeam', { org: o.id, name: 'ops' });
    const p = await done('createProject', { team: 'tree/research', name: 'bots' });
    expect(p).toMatchObject({ path: 'tree/research/bots', team: { path: 'tree/research' } });
    await done('createProject', { team: team.id, name: 'vision' });
    const audits = await db().auditEvent.findMany({
      where: { action: { in: ['createOrg', 'createTeam', 'createProject'] }, outcome: 'DONE' },
      orderBy: { id: 'asc' },
    });
    expect(audits.map((a) => a.target)).toEqual([
      'tree',
      'tree/research',
      'tree/ops',
      'tree/research/bots',
      'tree/research/vision',
    ]);

    const r = await t.gql(
      '{ orgs { name teams { path projects { path } } } org(name: "tree") { id } }',
      {},
      { token: viewer },
    );
    expect(r.data?.orgs).toContainEqual({
      name: 'tree',
      teams: [
        { path: 'tree/ops', projects: [] },
        { path: 'tree/research', projects: [{ path: 'tree/research/bots' }, { path: 'tree/research/vision' }] },
      ],
    });
    expect(r.data?.org.id).toBe(o.id);
    const byId = await t.gql('query($n: String!) { org(name: $n) { name } }', { n: o.id }, { token: viewer });
    expect(byId.data?.org).toEqual({ name: 'tree' });
  });

  it('refuses a name that is not one, saying what a name is', async () => {
    const r = await refused('createOrg', { name: 'my org' });
    expect(r).toMatchObject({ __typename: 'ValidationError', field: 'name' });
    expect(r.message).toMatch(/letters, digits, '\.', '_' and '-'.*up to 100/);
    expect(await refused('createOrg', { name: 'a'.repeat(101) })).toMatchObject({ field: 'name' });
    expect(await refused('createTeam', { org: 'tree', name: 'a/b' })).toMatchObject({ field: 'name' });
    expect(await refused('createProject', { team: 'tree/research', name: '..' })).toMatchObject({ field: 'name' });
  });

  it('refuses a name that reads as an id, since ids and names share the fields', async () => {
    const r = await refused('createOrg', { name: '6f1c2b5e-0000-4000-8000-000000000001' });
    expect(r).toMatchObject({ field: 'name' });
    expect(r.message).toMatch(/may not look like an id/);
  });

  it('refuses a name already taken, where it is taken', async () => {
    expect(await refused('createOrg', { name: 'tree' })).toMatchObject({
      __typename: 'ConflictError',
      message: 'an org named tree already exists',
    });
    expect(await refused('createTeam', { org: 'tree', name: 'research' })).toMatchObject({
      __typename: 'ConflictError',
      message: 'org tree already has a team research',
    });
    expect(await refused('createProject', { team: 'tree/research', name: 'bots' })).toMatchObject({
      __typename: 'ConflictError',
      message: 'team tree/research already has a project bots',
    });
    // The same names are free elsewhere.
    await done('createOrg', { name: 'other-tree' });
    await done('createTeam', { org: 'other-tree', name: 'research' });
    await done('createProject', { team: 'tree/ops', name: 'bots' });
  });

  it('refuses a parent that is not there, naming the field and the forms it takes', async () => {
    expect(await refused('createTeam', { org: 'nope', name: 'x' })).toMatchObject({
      field: 'org',
      message: 'org: no org nope (an org is named by its name or id)',
    });
    expect(await refused('createProject', { team: 'research', name: 'x' })).toMatchObject({
      field: 'team',
      message: 'team: a team is named by its path org/team, or its id; "research" is not',
    });
    expect(await refused('createProject', { team: 'tree/nope', name: 'x' })).toMatchObject({
      field: 'team',
      message: 'team: org tree has no team nope',
    });
    expect(await refused('createProject', { team: '00000000-0000-4000-8000-000000000000', name: 'x' })).toMatchObject({
      field: 'team',
      message: 'team: no team with id 00000000-0000-4000-8000-000000000000',
    });
  });

  it('is for admins: an operator is refused, typed and audited', async () => {
    const r = await refused('createOrg', { name: 'by-operator' }, operator);
    expect(r).toMatchObject({
      __typename: 'ForbiddenError',
      message: 'createOrg needs the ADMIN role; this caller has OPERATOR',
    });
    expect(await refused('createTeam', { org: 'tree', name: 'x' }, viewer)).toMatchObject({
      __typename: 'ForbiddenError',
    });
  });

  it('refuses every org mutation to an anonymous caller, typed and audited', async () => {
    // test/audit-coverage.test.ts checks the typed refusal and its audit event for every mutation; this also
    // checks that the refused call changed nothing.
    const id = '00000000-0000-4000-8000-000000000000';
    const calls: [Name, Record<string, unknown>][] = [
      ['createOrg', { name: 'anon' }],
      ['deleteOrg', { id }],
      ['createTeam', { org: 'tree', name: 'anon' }],
      ['deleteTeam', { id }],
      ['createProject', { team: 'tree/research', name: 'anon' }],
      ['deleteProject', { id }],
      ['addMember', { i: { org: 'tree', user: 'admin@example.com' } }],
      ['removeMember', { id }],
      ['createCollection', { i: { org: 'tree', name: 'anon', owner: 'org:tree' } }],
      ['deleteCollection', { id }],
    ];
    for (const [name, variables] of calls) {
      const r = await refused(name, variables, '');
      expect(r.__typename, name).toBe('UnauthenticatedError');
      const last = await db().auditEvent.findFirstOrThrow({ orderBy: { id: 'desc' } });
      expect(last).toMatchObject({ action: name, outcome: 'REFUSED', actor: 'anonymous' });
    }
  });
});

describe('members', () => {
  let alice: { id: string };
  let aliceKey: { id: string };

  beforeAll(async () => {
    alice = await user('alice@members.test');
    aliceKey = await key('alice-ci', alice.id);
  });

  it('adds a user to an org, a team and a project, by name, path or id; audited with the place', async () => {
    const inOrg = await done('addMember', { i: { org: 'tree', user: 'Alice@Members.test' } });
    expect(inOrg).toMatchObject({ place: 'tree', member: 'user:alice@members.test', team: null, project: null });
    const inTeam = await done('addMember', { i: { org: 'tree', team: 'research', user: alice.id } });
    expect(inTeam).toMatchObject({ place: 'tree/research', team: { name: 'research' }, project: null });
    // A project's membership names its team too, so the row says the whole place.
    const inProject = await done('addMember', {
      i: { org: 'tree', project: 'tree/research/bots', apiToken: aliceKey.id },
    });
    expect(inProject).toMatchObject({
      place: 'tree/research/bots',
      member: `key:${aliceKey.id}`,
      team: { name: 'research' },
      project: { name: 'bots' },
    });
    await done('addMember', { i: { org: 'tree', team: 'tree/research', project: 'vision', user: alice.id } });
    const audit = await db().auditEvent.findFirstOrThrow({ where: { action: 'addMember' }, orderBy: { id: 'desc' } });
    expect(audit).toMatchObject({ target: 'tree/research/vision', message: 'user alice@members.test' });

    const r = await t.gql(
      `{ org(name: "tree") { members { place } teams { path members { place } projects { path members { member } } } } }`,
      {},
      { token: viewer },
    );
    const tree = r.data?.org;
    expect(tree.members.map((m: { place: string }) => m.place)).toEqual([
      'tree',
      'tree/research',
      'tree/research/bots',
      'tree/research/vision',
    ]);
    const research = tree.teams.find((x: { path: string }) => x.path === 'tree/research');
    expect(research.members).toEqual([{ place: 'tree/research' }]);
    expect(research.projects).toEqual([
      { path: 'tree/research/bots', members: [{ member: `key:${aliceKey.id}` }] },
      { path: 'tree/research/vision', members: [{ member: 'user:alice@members.test' }] },
    ]);
  });

  it("shows a member's API token to admins only", async () => {
    const query = '{ org(name: "tree") { members { member apiToken { name } } } }';
    const asAdmin = await t.gql(query, {}, { token: admin });
    expect(asAdmin.errors).toBeUndefined();
    expect(asAdmin.data?.org.members).toContainEqual({ member: `key:${aliceKey.id}`, apiToken: { name: 'alice-ci' } });
    const asViewer = await t.gql(query, {}, { token: viewer });
    expect(asViewer.errors?.[0]?.message).toMatch(/ADMIN/);
  });

  it('keeps one membership when the same one is added at once by several callers', async () => {
    const u = await user('racer@members.test');
    const results = await Promise.all(
      Array.from({ length: 5 }, () => run('addMember', { i: { org: 'tree', team: 'ops', user: u.id } })),
    );
    expect(results.map((r) => r.__typename).sort()).toEqual([
      'ConflictError',
      'ConflictError',
      'ConflictError',
      'ConflictError',
      'Membership',
    ]);
    expect(await db().membership.count({ where: { userId: u.id } })).toBe(1);
  });

  it('refuses a second membership at the same place', async () => {
    expect(await refused('addMember', { i: { org: 'tree', team: 'research', user: 'alice@members.test' } })).toEqual({
      __typename: 'ConflictError',
      code: 'CONFLICT',
      message: 'user alice@members.test is already a member of tree/research',
    });
  });

  it('takes a user or an API token, one of the two', async () => {
    const both = await refused('addMember', { i: { org: 'tree', user: alice.id, apiToken: aliceKey.id } });
    expect(both).toMatchObject({ field: 'input.user' });
    expect(both.message).toMatch(/input\.user.*or an API token \(input\.apiToken.*one of the two/);
    expect(await refused('addMember', { i: { org: 'tree' } })).toMatchObject({ field: 'input.user' });
  });

  it('refuses places that are not inside the org, or not there', async () => {
    expect(await refused('addMember', { i: { org: 'nope', user: alice.id } })).toMatchObject({ field: 'input.org' });
    expect(
      await refused('addMember', { i: { org: 'tree', team: 'other-tree/research', user: alice.id } }),
    ).toMatchObject({
      field: 'input.team',
      message: 'input.team: team other-tree/research is in org other-tree, not tree',
    });
    expect(await refused('addMember', { i: { org: 'tree', team: 'nope', user: alice.id } })).toMatchObject({
      field: 'input.team',
      message: 'input.team: org tree has no team nope',
    });
    expect(await refused('addMember', { i: { org: 'tree', project: 'bots', user: alice.id } })).toMatchObject({
      field: 'input.project',
      message:
        'input.project: a project is named by its path org/team/project, or its id (a bare name needs the team too); "bots" is not',
    });
    expect(
      await refused('addMember', { i: { org: 'tree', team: 'ops', project: 'tree/research/bots', user: alice.id } }),
    ).toMatchObject({
      field: 'input.project',
      message: 'input.project: project tree/research/bots is not in team tree/ops',
    });
    expect(
      await refused('addMember', { i: { org: 'other-tree', project: 'tree/research/bots', user: alice.id } }),
    ).toMatchObject({
      field: 'input.project',
      message: 'input.project: project tree/research/bots is not in org other-tree',
    });
  });

  it('refuses members that are not there or could not act', async () => {
    expect(await refused('addMember', { i: { org: 'tree', user: 'nobody@members.test' } })).toMatchObject({
      field: 'input.user',
      message: 'input.user: no user nobody@members.test',
    });
    expect(await refused('addMember', { i: { org: 'tree', user: 'alice' } })).toMatchObject({
      field: 'input.user',
      message: 'input.user: a user is named by their email or id; "alice" is neither',
    });
    expect(await refused('addMember', { i: { org: 'tree', apiToken: 'alice-ci' } })).toMatchObject({
      field: 'input.apiToken',
    });
    const revoked = await key('revoked', alice.id, { revokedAt: new Date() });
    expect(await refused('addMember', { i: { org: 'tree', apiToken: revoked.id } })).toMatchObject({
      field: 'input.apiToken',
      message: 'input.apiToken: API token revoked (alice@members.test) is revoked',
    });
    const gone = await user('gone@members.test');
    await db().user.update({ where: { id: gone.id }, data: { disabledAt: new Date() } });
    expect(await refused('addMember', { i: { org: 'tree', user: gone.id } })).toMatchObject({
      field: 'input.user',
      message: 'input.user: gone@members.test is disabled; enable them first (updateUser)',
    });
  });

  it('removes a membership and answers with the org; an unknown id is NotFound', async () => {
    const m = await done('addMember', { i: { org: 'other-tree', user: alice.id } });
    const r = await done('removeMember', { id: m.id });
    expect(r).toMatchObject({ __typename: 'Org', name: 'other-tree', members: [] });
    const audit = await db().auditEvent.findFirstOrThrow({
      where: { action: 'removeMember' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({ target: 'other-tree', message: 'user alice@members.test' });
    expect(await refused('removeMember', { id: m.id })).toMatchObject({
      __typename: 'NotFoundError',
      message: `no membership with id ${m.id}`,
    });
    expect(await refused('removeMember', { id: 'not-an-id' })).toMatchObject({ __typename: 'NotFoundError' });
  });
});

describe('collections', () => {
  let bob: { id: string };
  let bobKey: { id: string };
  let outsider: { id: string };

  beforeAll(async () => {
    bob = await user('bob@collections.test');
    bobKey = await key('bob-ci', bob.id);
    outsider = await user('outsider@collections.test');
    await done('addMember', { i: { org: 'tree', team: 'ops', user: bob.id } });
    await done('addMember', { i: { org: 'tree', apiToken: bobKey.id } });
  });

  it('creates a collection for each kind of owner inside the org, audited with its owner', async () => {
    const made = [
      await done('createCollection', { i: { org: 'tree', name: 'handbook', owner: 'org:tree' } }),
      await done('createCollection', { i: { org: 'tree', name: 'papers', owner: 'team:tree/research' } }),
      await done('createCollection', { i: { org: 'tree', name: 'bot-logs', owner: 'project:tree/research/bots' } }),
      await done('createCollection', { i: { org: 'tree', name: 'bob-notes', owner: 'user:bob@collections.test' } }),
      await done('createCollection', { i: { org: 'tree', name: 'ci-kb', owner: `key:${bobKey.id}` } }),
    ];
    expect(made.map((c) => [c.name, c.ownerScope, c.owner])).toEqual([
      ['handbook', 'ORG', 'org:tree'],
      ['papers', 'TEAM', 'team:tree/research'],
      ['bot-logs', 'PROJECT', 'project:tree/research/bots'],
      ['bob-notes', 'USER', 'user:bob@collections.test'],
      ['ci-kb', 'KEY', 'key:bob-ci (bob@collections.test)'],
    ]);
    expect(made[3].ownerId).toBe(bob.id);
    const audit = await db().auditEvent.findFirstOrThrow({
      where: { action: 'createCollection' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({
      target: 'ci-kb',
      message: 'in org tree, owned by key:bob-ci (bob@collections.test)',
    });

    const r = await t.gql('{ collections(org: "tree") { name owner org { name } } }', {}, { token: viewer });
    expect(r.data?.collections.map((c: { name: string; owner: string }) => `${c.name} ${c.owner}`)).toEqual([
      'bob-notes user:bob@collections.test',
      'bot-logs project:tree/research/bots',
      'ci-kb key:bob-ci (bob@collections.test)',
      'handbook org:tree',
      'papers team:tree/research',
    ]);
    const all = await t.gql('{ orgs { name collections { name } } }', {}, { token: viewer });
    expect(all.data?.orgs.find((o: { name: string }) => o.name === 'tree').collections).toHaveLength(5);
  });

  it('refuses an owner outside the org', async () => {
    expect(await refused('createCollection', { i: { org: 'tree', name: 'x', owner: 'org:other-tree' } })).toMatchObject(
      {
        field: 'input.owner',
        message:
          'input.owner: org:other-tree is not in org tree; a collection there belongs to the org, one of its teams or projects, or one of its members',
      },
    );
    expect(
      await refused('createCollection', { i: { org: 'tree', name: 'x', owner: 'team:other-tree/research' } }),
    ).toMatchObject({ field: 'input.owner' });
    expect(
      await refused('createCollection', { i: { org: 'tree', name: 'x', owner: 'user:outsider@collections.test' } }),
    ).toMatchObject({
      field: 'input.owner',
      message: 'input.owner: user:outsider@collections.test is not a member of org tree: add them first (addMember)',
    });
    expect(outsider.id).toBeTruthy();
  });

  it('refuses an owner it cannot read, a taken name, and an unknown org', async () => {
    const r = await refused('createCollection', { i: { org: 'tree', name: 'x', owner: 'tree' } });
    expect(r).toMatchObject({ field: 'input.owner' });
    expect(r.message).toBe(
      'input.owner: an owner is org:<name or id>, team:<org/team or id>, project:<org/team/project or id>, user:<email or id> or key:<API token id>; "tree" is not',
    );
    expect(await refused('createCollection', { i: { org: 'tree', name: 'papers', owner: 'org:tree' } })).toMatchObject({
      __typename: 'ConflictError',
      message: 'org tree already has a collection papers',
    });
    expect(await refused('createCollection', { i: { org: 'nope', name: 'x', owner: 'org:tree' } })).toMatchObject({
      field: 'input.org',
    });
    expect(
      await refused('createCollection', { i: { org: 'tree', name: 'bad name', owner: 'org:tree' } }),
    ).toMatchObject({
      field: 'input.name',
    });
  });

  it('deletes a collection and answers with its org', async () => {
    const c = await done('createCollection', { i: { org: 'tree', name: 'scratch', owner: 'org:tree' } });
    const r = await done('deleteCollection', { id: c.id });
    expect(r.collections.map((x: { name: string }) => x.name)).not.toContain('scratch');
    expect(await refused('deleteCollection', { id: c.id })).toMatchObject({ __typename: 'NotFoundError' });
  });
});

describe('resolveOwner', () => {
  let carol: { id: string; email: string };
  let carolKey: { id: string };
  let ids: { org: string; team: string; project: string };

  beforeAll(async () => {
    carol = await user('carol@owners.test');
    carolKey = await key('carol-ci', carol.id);
    const o = await db().org.findUniqueOrThrow({ where: { name: 'tree' } });
    const team = await db().team.findFirstOrThrow({ where: { orgId: o.id, name: 'research' } });
    const project = await db().project.findFirstOrThrow({ where: { teamId: team.id, name: 'bots' } });
    ids = { org: o.id, team: team.id, project: project.id };
  });

  it('reads each form, by name or path and by id', async () => {
    const cases: [string, OwnerScope, string, string][] = [
      ['org:tree', 'org', ids.org, 'org:tree'],
      [`org:${ids.org}`, 'org', ids.org, 'org:tree'],
      ['team:tree/research', 'team', ids.team, 'team:tree/research'],
      [`team:${ids.team}`, 'team', ids.team, 'team:tree/research'],
      ['project:tree/research/bots', 'project', ids.project, 'project:tree/research/bots'],
      [`project:${ids.project}`, 'project', ids.project, 'project:tree/research/bots'],
      ['user:Carol@Owners.test', 'user', carol.id, 'user:carol@owners.test'],
      [`user:${carol.id}`, 'user', carol.id, 'user:carol@owners.test'],
      [`key:${carolKey.id}`, 'key', carolKey.id, 'key:carol-ci (carol@owners.test)'],
      [' team: tree/research ', 'team', ids.team, 'team:tree/research'],
    ];
    for (const [input, scope, id, label] of cases) {
      expect(await org.resolveOwner(input), input).toEqual({ ok: true, value: { scope, id, label } });
    }
  });

  it('says which forms are accepted when the form is wrong', async () => {
    for (const input of ['', 'tree', 'group:tree', 'org:', 'team:research', 'team:a/b/c', 'project:tree/research']) {
      const r = await org.resolveOwner(input);
      expect(r.ok, input).toBe(false);
      if (r.ok) continue;
      expect(r.error).toMatchObject({ name: 'ValidationError', field: 'owner' });
      expect(r.error.message, input).toMatch(/^owner: /);
      expect(r.error.message, input).toMatch(/an owner is org:|a team is named by|a project is named by/);
    }
    const r = await org.resolveOwner('key:carol-ci');
    expect(!r.ok && r.error.message).toBe(
      'owner: an API token is named by its id (apiTokens lists them), not "carol-ci"',
    );
  });

  it('says what was not found', async () => {
    const missing = '00000000-0000-4000-8000-00000000dead';
    const cases: [string, string][] = [
      ['org:nope', 'owner: no org nope (an org is named by its name or id)'],
      [`org:${missing}`, `owner: no org ${missing} (an org is named by its name or id)`],
      ['team:nope/research', 'owner: no org nope, so no team nope/research'],
      ['team:tree/nope', 'owner: org tree has no team nope'],
      [`team:${missing}`, `owner: no team with id ${missing}`],
      ['project:tree/research/nope', 'owner: team tree/research has no project nope'],
      ['project:tree/nope/bots', 'owner: org tree has no team nope'],
      [`project:${missing}`, `owner: no project with id ${missing}`],
      ['user:nobody@owners.test', 'owner: no user nobody@owners.test'],
      [`user:${missing}`, `owner: no user ${missing}`],
      [`key:${missing}`, `owner: no API token with id ${missing}`],
    ];
    for (const [input, message] of cases) {
      expect(await org.resolveOwner(input), input).toMatchObject({ ok: false, error: { field: 'owner', message } });
    }
  });

  it('names the field the caller gives', async () => {
    expect(await org.resolveOwner('org:nope', { field: 'input.owner' })).toMatchObject({
      ok: false,
      error: { field: 'input.owner', message: 'input.owner: no org nope (an org is named by its name or id)' },
    });
  });

  it('formats stored owners for people, and says when one is gone', async () => {
    expect(await org.formatOwner({ scope: 'team', id: ids.team })).toBe('team:tree/research');
    expect(await org.formatOwner(`project:${ids.project}`)).toBe('project:tree/research/bots');
    expect(await org.formatOwner(`key:${carolKey.id}`)).toBe('key:carol-ci (carol@owners.test)');
    const gone = '00000000-0000-4000-8000-00000000beef';
    expect(await org.formatOwner({ scope: 'org', id: gone })).toBe(`org:${gone} (deleted)`);
    expect(await org.formatOwner('something else')).toBe('something else');
    expect(ownerKey({ scope: 'user', id: carol.id })).toBe(`user:${carol.id}`);
    expect(parseOwnerKey(`user:${carol.id}`)).toEqual({ scope: 'user', id: carol.id });
    expect(parseOwnerKey('user:carol@owners.test')).toBeUndefined();
  });
});

describe('who may read a collection', () => {
  // acme: teams research (projects bots, vision) and ops; beta: team lab.
  // Members: ana in the team research, ben in the project bots, cat in the org acme, dan in beta;
  // ana's key in the project bots, a key of dan's in beta/lab.
  const o: Record<string, { scope: OwnerScope; id: string }> = {};
  const c: Record<string, string> = {};

  beforeAll(async () => {
    await done('createOrg', { name: 'acme' });
    await done('createOrg', { name: 'beta' });
    for (const [orgName, team] of [
      ['acme', 'research'],
      ['acme', 'ops'],
      ['beta', 'lab'],
    ] as const)
      await done('createTeam', { org: orgName, name: team });
    for (const p of ['bots', 'vision']) await done('createProject', { team: 'acme/research', name: p });
    const people = {
      ana: await user('ana@read.test'),
      ben: await user('ben@read.test'),
      cat: await user('cat@read.test'),
      dan: await user('dan@read.test'),
    };
    const anaKey = await key('ana-ci', people.ana.id);
    const danKey = await key('dan-ci', people.dan.id);
    await done('addMember', { i: { org: 'acme', team: 'research', user: people.ana.id } });
    await done('addMember', { i: { org: 'acme', project: 'acme/research/bots', user: people.ben.id } });
    await done('addMember', { i: { org: 'acme', user: people.cat.id } });
    await done('addMember', { i: { org: 'beta', user: people.dan.id } });
    await done('addMember', { i: { org: 'acme', project: 'acme/research/bots', apiToken: anaKey.id } });
    await done('addMember', { i: { org: 'beta', team: 'lab', apiToken: danKey.id } });

    for (const [name, owner] of [
      ['acme', 'org:acme'],
      ['beta', 'org:beta'],
      ['research', 'team:acme/research'],
      ['ops', 'team:acme/ops'],
      ['bots', 'project:acme/research/bots'],
      ['vision', 'project:acme/research/vision'],
      ['ana', 'user:ana@read.test'],
      ['ana-ci', `key:${anaKey.id}`],
    ] as const) {
      const r = await org.resolveOwner(owner);
      if (!r.ok) throw r.error;
      o[name] = r.value;
      const orgName = name === 'beta' ? 'beta' : 'acme';
      c[name] = (await done('createCollection', { i: { org: orgName, name: `kb-${name}`, owner } })).id;
    }
    for (const [name, owner] of [
      ['ben', 'user:ben@read.test'],
      ['cat', 'user:cat@read.test'],
      ['dan', 'user:dan@read.test'],
      ['dan-ci', `key:${danKey.id}`],
      ['lab', 'team:beta/lab'],
    ] as const) {
      const r = await org.resolveOwner(owner);
      if (!r.ok) throw r.error;
      o[name] = r.value;
    }
  });

  // [owner, collection (by its owner), may read, why]
  const table: [string, string, boolean, string][] = [
    // An org stands for all its members: it reads only what the whole org may.
    ['acme', 'acme', true, 'the org reads its own'],
    ['acme', 'research', false, "the org may NOT read a team's: its members outside the team would learn it"],
    ['acme', 'bots', false, "nor a project's"],
    ['acme', 'ana', false, "nor a member's own"],
    ['acme', 'ana-ci', false, "nor a key's own"],
    ['acme', 'beta', false, "nor another org's"],
    // A team reads its org's and its own.
    ['research', 'acme', true, "a team reads its org's"],
    ['research', 'research', true, 'and its own'],
    ['ops', 'research', false, "a sibling team may not read the team's"],
    ['research', 'bots', false, "a team may not read its project's: the team is wider"],
    ['research', 'ana', false, "nor a member's own"],
    ['lab', 'acme', false, "a team in another org may not read the org's"],
    // A project reads its org's, its team's and its own.
    ['bots', 'acme', true, "a project reads its org's"],
    ['bots', 'research', true, "a project inside the team reads the team's"],
    ['bots', 'bots', true, 'and its own'],
    ['vision', 'bots', false, "a sibling project may not read the project's"],
    ['bots', 'ops', false, "nor another team's"],
    // A user reads what their memberships give them, and their own.
    ['ana', 'acme', true, "a member of a team is a member of the org: reads the org's"],
    ['ana', 'research', true, "a member of the team reads the team's"],
    ['ana', 'bots', false, "a team member not in the project may not read the project's"],
    ['ana', 'ana', true, 'a user reads their own'],
    ['ana', 'ana-ci', false, "a user may not read their key's: the key is its own principal"],
    ['ben', 'research', true, "a member of a project in the team reads the team's"],
    ['ben', 'bots', true, "and the project's"],
    ['ben', 'vision', false, "but not a sibling project's"],
    ['ben', 'ana', false, "nor another user's"],
    ['cat', 'acme', true, "a member of the org reads the org's"],
    ['cat', 'research', false, "but not a team's she is not in"],
    ['dan', 'acme', false, 'a member of another org reads nothing here'],
    ['dan', 'beta', true, "dan reads his org's"],
    // A key is a principal of its own: its memberships, and its own.
    ['ana-ci', 'bots', true, "a key in the project reads the project's"],
    ['ana-ci', 'research', true, "and its team's"],
    ['ana-ci', 'acme', true, "and its org's"],
    ['ana-ci', 'ana-ci', true, 'and its own'],
    ['ana-ci', 'ana', false, "but not its user's: a key may be given less than its user has"],
    ['ana-ci', 'vision', false, "nor a sibling project's"],
    ['dan-ci', 'acme', false, 'a key in another org may not'],
    ['dan-ci', 'beta', true, "a key in a team of beta reads beta's"],
  ];

  it.each(table)('%s reading the collection of %s: %s (%s)', async (owner, collection, expected) => {
    expect(await org.canRead(o[owner] as { scope: OwnerScope; id: string }, c[collection] as string)).toBe(expected);
  });

  it('readableCollections gives the same answers as canRead, for every owner', async () => {
    for (const [name, owner] of Object.entries(o)) {
      const readable = await org.readableCollections(owner);
      const expected = new Set<string>();
      for (const id of Object.values(c)) if (await org.canRead(owner, id)) expected.add(id);
      expect(new Set([...readable].filter((id) => Object.values(c).includes(id))), name).toEqual(expected);
    }
    const ben = await org.readableCollections(o.ben as { scope: OwnerScope; id: string });
    expect([...ben].map((id) => Object.entries(c).find(([, v]) => v === id)?.[0]).sort()).toEqual([
      'acme',
      'bots',
      'research',
    ]);
  });

  it("lets a caller read what an owner owns exactly when the caller could read that owner's collection", async () => {
    // Who may read an owned job's pairs and artifacts, and fetch an owned adapter (OrgService.mayRead): a session
    // reads as its user, an API token as its key; admins always; null (public) is everyone.
    const asViewer = (name: string, role: 'VIEWER' | 'ADMIN' = 'VIEWER'): Viewer => {
      const p = o[name] as { scope: OwnerScope; id: string };
      const user = { id: p.id, email: `${name}@read.test`, name, role };
      return p.scope === 'key'
        ? { kind: 'token', user, role, tokenId: p.id, tokenName: name }
        : { kind: 'user', user, role, sessionId: 'session' };
    };
    const callers = ['ana', 'ben', 'cat', 'dan', 'ana-ci', 'dan-ci'];
    for (const caller of callers)
      for (const owner of Object.keys(c)) {
        const expected = await org.canRead(o[caller] as { scope: OwnerScope; id: string }, c[owner] as string);
        const key = ownerKey(o[owner] as { scope: OwnerScope; id: string });
        expect(await org.mayRead(asViewer(caller), key), `${caller} reading what ${owner} owns`).toBe(expected);
        expect(await org.mayRead(asViewer(caller, 'ADMIN'), key), `${caller} as an admin`).toBe(true);
        expect(await org.mayRead(asViewer(caller), null), `${caller}, public`).toBe(true);
      }
    expect(await org.mayRead({ kind: 'node', node: { id: o.ana?.id as string, name: 'n' } }, 'org:x')).toBe(false);
    expect(await org.mayRead({ kind: 'anonymous' }, ownerKey(o.acme as { scope: OwnerScope; id: string }))).toBe(false);
    expect(await org.mayRead(asViewer('ana'), 'team:not-an-id')).toBe(false);
  });

  it('follows membership: a removed member no longer reads', async () => {
    const ben = o.ben as { scope: OwnerScope; id: string };
    const m = await db().membership.findFirstOrThrow({ where: { userId: ben.id } });
    await done('removeMember', { id: m.id });
    expect(await org.canRead(ben, c.bots as string)).toBe(false);
    expect(await org.readableCollections(ben)).toEqual(new Set());
    await done('addMember', { i: { org: 'acme', project: 'acme/research/bots', user: ben.id } });
    expect(await org.canRead(ben, c.bots as string)).toBe(true);
  });

  it('an owner or a collection that is not there reads nothing', async () => {
    const gone = { scope: 'team' as const, id: '00000000-0000-4000-8000-00000000dead' };
    expect(await org.readableCollections(gone)).toEqual(new Set());
    expect(await org.canRead(gone, c.acme as string)).toBe(false);
    expect(await org.canRead(o.acme as { scope: OwnerScope; id: string }, gone.id)).toBe(false);
    expect(await org.canRead(o.acme as { scope: OwnerScope; id: string }, 'not-an-id')).toBe(false);
    expect(await org.collection(c.acme as string)).toMatchObject({ name: 'kb-acme', ownerScope: 'org' });
    expect(await org.collection('not-an-id')).toBeNull();
  });
});

describe('deleting', () => {
  it('refuses to delete a project, team or org that still holds collections, then deletes once they are gone', async () => {
    await done('createOrg', { name: 'doomed' });
    const team = await done('createTeam', { org: 'doomed', name: 'crew' });
    const project = await done('createProject', { team: 'doomed/crew', name: 'job' });
    const u = await user('member@doomed.test');
    await done('addMember', { i: { org: 'doomed', project: 'doomed/crew/job', user: u.id } });
    const kb = await done('createCollection', {
      i: { org: 'doomed', name: 'job-kb', owner: 'project:doomed/crew/job' },
    });

    expect(await refused('deleteProject', { id: project.id })).toEqual({
      __typename: 'ConflictError',
      code: 'CONFLICT',
      message:
        'project doomed/crew/job still holds collection job-kb: delete it first, so nothing is left owned by a part of the tree that is gone',
    });
    expect(await refused('deleteTeam', { id: team.id })).toMatchObject({ __typename: 'ConflictError' });
    const o = await db().org.findUniqueOrThrow({ where: { name: 'doomed' } });
    expect(await refused('deleteOrg', { id: o.id })).toMatchObject({ __typename: 'ConflictError' });

    await done('deleteCollection', { id: kb.id });
    const r = await done('deleteProject', { id: project.id });
    expect(r).toMatchObject({ __typename: 'Team', path: 'doomed/crew', projects: [] });
    expect(await db().membership.count({ where: { orgId: o.id } })).toBe(0);
    const audit = await db().auditEvent.findFirstOrThrow({
      where: { action: 'deleteProject' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({ outcome: 'DONE', target: 'doomed/crew/job', message: 'with 1 membership' });
  });

  it("refuses while an adapter or a user's collection in the org would be left behind", async () => {
    const o = await db().org.findUniqueOrThrow({ where: { name: 'doomed' } });
    const team = await db().team.findFirstOrThrow({ where: { orgId: o.id } });
    const model = await db().catalogModel.create({
      data: { name: 'doomed-model', source: 'http://x/m.gguf', engine: 'llamacpp', minReplicas: 0, maxReplicas: 0 },
    });
    const adapter = await db().adapter.create({
      data: {
        name: 'crew-adapter',
        source: 'http://x/a.gguf',
        owner: ownerKey({ scope: 'team', id: team.id }),
        modelId: model.id,
      },
    });
    expect(await refused('deleteTeam', { id: team.id })).toMatchObject({
      __typename: 'ConflictError',
      message:
        'team doomed/crew still holds adapter crew-adapter: delete it first, so nothing is left owned by a part of the tree that is gone',
    });
    expect(await refused('deleteOrg', { id: o.id })).toMatchObject({ __typename: 'ConflictError' });
    await db().adapter.delete({ where: { id: adapter.id } });

    const u = await db().user.findUniqueOrThrow({ where: { email: 'member@doomed.test' } });
    await done('addMember', { i: { org: 'doomed', user: u.id } });
    const kb = await done('createCollection', {
      i: { org: 'doomed', name: 'notes', owner: 'user:member@doomed.test' },
    });
    const r = await refused('deleteOrg', { id: o.id });
    expect(r.message).toMatch(/^org doomed still holds collection notes: delete it first/);
    await done('deleteCollection', { id: kb.id });
  });

  it('deletes a team with its projects, and an org with everything left in it', async () => {
    const o = await db().org.findUniqueOrThrow({ where: { name: 'doomed' } });
    await done('createProject', { team: 'doomed/crew', name: 'second' });
    const team = await db().team.findFirstOrThrow({ where: { orgId: o.id, name: 'crew' } });
    const r = await done('deleteTeam', { id: team.id });
    expect(r).toMatchObject({ __typename: 'Org', name: 'doomed', teams: [] });
    expect(await db().project.count({ where: { teamId: team.id } })).toBe(0);
    await done('createTeam', { org: 'doomed', name: 'again' });
    const removed = await done('deleteOrg', { id: o.id });
    expect(removed).toEqual({ __typename: 'RemovedOrg', id: o.id, name: 'doomed' });
    const audit = await db().auditEvent.findFirstOrThrow({ where: { action: 'deleteOrg' }, orderBy: { id: 'desc' } });
    expect(audit).toMatchObject({
      outcome: 'DONE',
      target: 'doomed',
      message: 'with 1 team, 0 projects, 1 membership',
    });
    expect(await db().org.findUnique({ where: { id: o.id } })).toBeNull();
    expect(await db().membership.count({ where: { orgId: o.id } })).toBe(0);
    expect(await refused('deleteOrg', { id: o.id })).toMatchObject({ __typename: 'NotFoundError' });
    expect(await refused('deleteTeam', { id: team.id })).toMatchObject({ __typename: 'NotFoundError' });
  });
});

describe('membership changes are heard by the callers they concern', () => {
  // The gateway caches which owners a caller reaches, and live connections hold credentials: both drop what they
  // hold for a user when the 'credentials' topic names them. Heard here as another server replica would hear it,
  // through PostgreSQL's NOTIFY, so an event counts only once its change has committed.
  const pubsub = makePubSub();
  const events: string[] = [];
  let listener: Listener;
  let people: Record<'bob' | 'carol' | 'dave', { id: string }>;
  let daveKey: { id: string };

  beforeAll(async () => {
    listener = await listen(t.app.db.url, pubsub, createLogger('silent'));
    const end = Date.now() + 10_000;
    while (!listener.listening() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    void (async () => {
      for await (const holder of pubsub.subscribe('credentials')) events.push(holder);
    })();
    people = {
      bob: await user('bob@heard.test'),
      carol: await user('carol@heard.test'),
      dave: await user('dave@heard.test'),
    };
    daveKey = await key('dave-ci', people.dave.id);
    await done('createOrg', { name: 'heard' });
    await done('createTeam', { org: 'heard', name: 'crew' });
    await done('createProject', { team: 'heard/crew', name: 'side' });
  });
  afterAll(() => listener.stop());

  /** The users named on the topic while `work` ran (in the order heard), up to a marker sent after it. */
  async function heardDuring(work: () => Promise<unknown>): Promise<string[]> {
    const from = events.length;
    await work();
    const marker = `marker:${randomBytes(4).toString('hex')}`;
    await notify(db(), 'credentials', marker);
    const end = Date.now() + 10_000;
    while (!events.includes(marker) && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    expect(events).toContain(marker);
    return events.slice(from, events.indexOf(marker));
  }
  const holder = (who: { id: string }) => `user:${who.id}`;

  it('adding or removing a user names that user; an API token names its user', async () => {
    let bobIn: { id: string } | undefined;
    expect(
      await heardDuring(async () => {
        bobIn = await done('addMember', { i: { org: 'heard', user: 'bob@heard.test' } });
      }),
    ).toEqual([holder(people.bob)]);
    expect(
      await heardDuring(() => done('addMember', { i: { org: 'heard', team: 'crew', apiToken: daveKey.id } })),
    ).toEqual([holder(people.dave)]);
    expect(await heardDuring(() => done('removeMember', { id: bobIn?.id }))).toEqual([holder(people.bob)]);
  });

  it('a refused change is heard by nobody', async () => {
    await done('addMember', { i: { org: 'heard', user: 'carol@heard.test' } });
    expect(await heardDuring(() => refused('addMember', { i: { org: 'heard', user: 'carol@heard.test' } }))).toEqual(
      [],
    );
  });

  it('deleting a project, a team or an org names each user who was a member there, once', async () => {
    await done('addMember', { i: { org: 'heard', project: 'heard/crew/side', user: 'carol@heard.test' } });
    await done('addMember', { i: { org: 'heard', project: 'heard/crew/side', apiToken: daveKey.id } });
    await done('addMember', { i: { org: 'heard', team: 'crew', user: 'bob@heard.test' } });
    const side = await db().project.findFirstOrThrow({ where: { name: 'side', team: { name: 'crew' } } });
    const crew = await db().team.findFirstOrThrow({ where: { name: 'crew', org: { name: 'heard' } } });
    const heardOrg = await db().org.findUniqueOrThrow({ where: { name: 'heard' } });

    const project = await heardDuring(() => done('deleteProject', { id: side.id }));
    expect(project.sort()).toEqual([holder(people.carol), holder(people.dave)].sort());
    // Dave's key is a member of the team itself as well: his user is told once.
    const team = await heardDuring(() => done('deleteTeam', { id: crew.id }));
    expect(team.sort()).toEqual([holder(people.bob), holder(people.dave)].sort());
    // Carol is still a member of the org itself.
    expect(await heardDuring(() => done('deleteOrg', { id: heardOrg.id }))).toEqual([holder(people.carol)]);
  });
});
