import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';

// What the Organisations page and `hangar org` ask of the server: owners by name on every list that shows one (one
// formatter, so a rename shows everywhere at once), renames, and what a removal would do before it is confirmed.

let t: TestApp;
let admin: string;
const db = () => t.app.db.prisma;

beforeAll(async () => {
  t = await startTestApp();
  admin = await t.token('ADMIN', 'console-admin');
});
afterAll(() => t.close());

async function gql(query: string, variables: Record<string, unknown> = {}) {
  const r = await t.gql(query, variables, { token: admin });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data as Record<string, any>;
}

const ERR = '__typename ... on Error { message }';

/** acme/support with a project, a member user and a member token; a model, an adapter and a job owned by the team. */
async function seedTeam(orgName: string) {
  const org = (await gql(`mutation($n: String!) { createOrg(name: $n) { ... on Org { id } } }`, { n: orgName }))
    .createOrg;
  const team = (
    await gql(`mutation($o: String!) { createTeam(org: $o, name: "support") { ... on Team { id } } }`, { o: orgName })
  ).createTeam;
  const project = (
    await gql(`mutation($t: String!) { createProject(team: $t, name: "tickets") { ... on Project { id } } }`, {
      t: `${orgName}/support`,
    })
  ).createProject;
  const user = await db().user.create({
    data: { email: `ana@${orgName}.test`, name: 'Ana', role: 'VIEWER', passwordHash: 'x' },
  });
  const key = await db().apiToken.create({
    data: { name: `${orgName}-bot`, prefix: 'hgk_x', tokenHash: `hash-${orgName}`, role: 'VIEWER', userId: user.id },
  });
  await gql(`mutation($i: AddMemberInput!) { addMember(input: $i) { ${ERR} } }`, {
    i: { org: orgName, team: 'support', user: user.email },
  });
  await gql(`mutation($i: AddMemberInput!) { addMember(input: $i) { ${ERR} } }`, {
    i: { org: orgName, team: 'support', project: 'tickets', apiToken: key.id },
  });
  const owner = `team:${team.id}`;
  const model = await db().catalogModel.create({
    data: { name: `${orgName}-base`, source: 'http://x/m.gguf', engine: 'llamacpp', minReplicas: 0, maxReplicas: 0 },
  });
  await db().adapter.create({
    data: { name: `${orgName}-lora`, source: 'http://x/a.gguf', owner, modelId: model.id },
  });
  await db().trainJob.create({
    data: {
      name: `${orgName}-lora`,
      model: model.name,
      baseRepo: 'hangar-test/tiny-llama',
      gpuMiB: 1000,
      owner,
      dataPath: '/nonexistent/pairs.ndjson',
      dataSha256: 'b'.repeat(64),
      dataBytes: 10,
      pairs: 1,
    },
  });
  const set = await gql(`mutation($n: String!, $o: String) { setModelOwner(name: $n, owner: $o) { ${ERR} } }`, {
    n: model.name,
    o: `team:${orgName}/support`,
  });
  expect(set.setModelOwner.__typename).not.toMatch(/Error$/);
  return { org, team, project, user, key, model };
}

/** Every owner a page shows for the seeded things, by the names the pages ask for. */
async function shownOwners(orgName: string, keyId: string) {
  const d = await gql(
    `query($m: String!) {
      model(name: $m) { owner ownerName adapters { name ownerName } }
      trainJobs { edges { node { name ownerName } } }
      apiTokens(all: true) { id ownerName memberOf }
      auditEvents(first: 5, filter: { action: "setModelOwner" }) { edges { node { target ownerName } } }
    }`,
    { m: `${orgName}-base` },
  );
  return {
    model: d.model.ownerName,
    modelOwner: d.model.owner,
    adapter: d.model.adapters[0].ownerName,
    job: d.trainJobs.edges.find((e: any) => e.node.name === `${orgName}-lora`).node.ownerName,
    audit: d.auditEvents.edges.find((e: any) => e.node.target === `${orgName}-base`).node.ownerName,
    token: d.apiTokens.find((k: any) => k.id === keyId),
  };
}

it('names the owner as team:acme/support on models, adapters, jobs, tokens and audit, and a rename shows on all at once', async () => {
  const s = await seedTeam('acme');
  expect(await shownOwners('acme', s.key.id)).toEqual({
    model: 'team:acme/support',
    modelOwner: 'team:acme/support',
    adapter: 'team:acme/support',
    job: 'team:acme/support',
    audit: 'team:acme/support',
    token: { id: s.key.id, ownerName: 'user:ana@acme.test', memberOf: ['acme/support/tickets'] },
  });

  const renamed = await gql(
    `mutation($id: ID!) { renameTeam(id: $id, name: "helpdesk") { ${ERR} ... on Team { path } } }`,
    {
      id: s.team.id,
    },
  );
  expect(renamed.renameTeam).toEqual({ __typename: 'Team', path: 'acme/helpdesk' });
  await gql(`mutation($id: ID!) { renameOrg(id: $id, name: "acme-corp") { ${ERR} } }`, { id: s.org.id });
  const after = await shownOwners('acme', s.key.id);
  expect([after.model, after.adapter, after.job, after.audit]).toEqual(Array(4).fill('team:acme-corp/helpdesk'));
  expect(after.token.memberOf).toEqual(['acme-corp/helpdesk/tickets']);
  // Owned by id: the team still owns what it owned, under its new name.
  expect((await db().adapter.findUniqueOrThrow({ where: { name: 'acme-lora' } })).owner).toBe(`team:${s.team.id}`);
  const audit = await db().auditEvent.findFirstOrThrow({ where: { action: 'renameTeam' }, orderBy: { id: 'desc' } });
  expect(audit).toMatchObject({ outcome: 'DONE', target: 'acme/support', message: 'renamed to acme/helpdesk' });
});

it('refuses a rename to a taken name or to a name that is not one, saying what is accepted', async () => {
  const a = (await gql(`mutation { createOrg(name: "north") { ... on Org { id } } }`)).createOrg;
  await gql(`mutation { createOrg(name: "south") { ... on Org { id } } }`);
  const taken = await gql(`mutation($id: ID!) { renameOrg(id: $id, name: "south") { ${ERR} } }`, { id: a.id });
  expect(taken.renameOrg).toEqual({ __typename: 'ConflictError', message: 'an org named south already exists' });
  const bad = await gql(`mutation($id: ID!) { renameOrg(id: $id, name: "my org") { ${ERR} } }`, { id: a.id });
  expect(bad.renameOrg.__typename).toBe('ValidationError');
  expect(bad.renameOrg.message).toContain("letters, digits, '.', '_' and '-'");
  expect((await db().org.findUniqueOrThrow({ where: { id: a.id } })).name).toBe('north');
});

it('shows what removing an org, a team or a project would do before it is confirmed', async () => {
  const s = await seedTeam('globex');
  const q = `query { org(name: "globex") {
    removal { what blocked models adapters trainJobs collections teams projects members apiTokens }
    teams { removal { what blocked adapters members apiTokens projects }
      projects { removal { what blocked adapters members apiTokens } } }
  } }`;
  const d = (await gql(q)).org;
  expect(d.removal).toEqual({
    what: 'org globex',
    blocked: true,
    models: ['globex-base'],
    adapters: ['globex-lora'],
    trainJobs: ['globex-lora'],
    collections: [],
    teams: ['globex/support'],
    projects: ['globex/support/tickets'],
    members: ['user:ana@globex.test at globex/support', 'key:globex-bot (ana@globex.test) at globex/support/tickets'],
    apiTokens: ['globex-bot (ana@globex.test)'],
  });
  expect(d.teams[0].removal).toMatchObject({ what: 'team globex/support', blocked: true, adapters: ['globex-lora'] });
  expect(d.teams[0].removal.members).toHaveLength(2);
  // The project owns nothing itself: removing it would only end the token's membership.
  expect(d.teams[0].projects[0].removal).toEqual({
    what: 'project globex/support/tickets',
    blocked: false,
    adapters: [],
    members: ['key:globex-bot (ana@globex.test) at globex/support/tickets'],
    apiTokens: ['globex-bot (ana@globex.test)'],
  });
  // The preview and the refusal agree.
  const refused = await gql(`mutation($id: ID!) { deleteTeam(id: $id) { ${ERR} } }`, { id: s.team.id });
  expect(refused.deleteTeam.message).toMatch(
    /^team globex\/support still holds model globex-base, adapter globex-lora/,
  );
});
