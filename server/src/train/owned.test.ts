import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { reportGpu, type TrainingWorld, tarOf, trainingWorld, writeAdapterDir } from '../../test/fixtures/training.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { serveMirror } from '../mirror/serve.js';

// What an owner owns stays with those it admits, on every path that hands it out: the job's pairs
// (GET /api/train/jobs/<id>/data), what the job made (…/artifacts/<kind>) and, once published, the adapter in the
// mirror (GET /mirror/…). The owner is team acme/secret; its collection is what the pairs come from.

let t: TestApp;
let hub: FakeHub;
let base: string;
let w: TrainingWorld;

/** Callers, each as a bearer token (or a session cookie), and who they are to team acme/secret. */
const who: Record<string, { token?: string; cookie?: string }> = {};
let secretJob: { id: string; name: string };
let publicJob: { id: string; name: string };
let otherNode: string;
let replicaNode: string;
let ownedSource: string;
let publicSource: string;
let pairs: string;

const CREATE = `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename
  ... on TrainJob { id name owner } ... on Error { message } } }`;
const CLAIM = `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }`;
const FINISH = `mutation($id: ID!) { finishTrainJob(id: $id, state: DONE) { __typename ... on Error { message } } }`;
const PUBLISH = `mutation($id: ID!) { publishTrainJob(id: $id) { __typename
  ... on TrainJobPublished { source owner } ... on Error { message } } }`;

const headers = (c: { token?: string; cookie?: string }): Record<string, string> =>
  c.token ? { authorization: `Bearer ${c.token}` } : c.cookie ? { cookie: c.cookie } : {};

async function createNode(name: string) {
  const r = await t.gql(
    `mutation { createNode(name: "${name}") { __typename ... on CreatedNode { token node { id } } } }`,
    {},
    { token: w.admin },
  );
  return { token: r.data?.createNode.token as string, id: r.data?.createNode.node.id as string };
}

/** A job trained to the end on gpu-1 and (unless told not to) published: its adapter goes into the mirror. */
async function trainAndPublish(input: Record<string, unknown>, publish = true) {
  const created = (await t.gql(CREATE, { i: input }, { token: w.operator })).data?.createTrainJob;
  expect(created.__typename).toBe('TrainJob');
  await reportGpu(t, w.nodeToken, 20_000);
  expect((await t.gql(CLAIM, { id: created.id }, { token: w.nodeToken })).data?.claimTrainJob.__typename).toBe(
    'TrainClaim',
  );
  const up = await fetch(`${base}/api/train/jobs/${created.id}/artifacts/peft`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${w.nodeToken}`, 'content-type': 'application/gzip' },
    body: new Uint8Array(await tarOf(await writeAdapterDir())),
  });
  expect(up.status).toBe(200);
  expect((await t.gql(FINISH, { id: created.id }, { token: w.nodeToken })).data?.finishTrainJob.__typename).toBe(
    'TrainJob',
  );
  if (!publish) return { job: { id: created.id as string, name: created.name as string }, source: '' };
  const pub = (await t.gql(PUBLISH, { id: created.id }, { token: w.admin })).data?.publishTrainJob;
  expect(pub.__typename).toBe('TrainJobPublished');
  return { job: { id: created.id as string, name: created.name as string }, source: pub.source as string };
}

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
  const p = t.app.db.prisma;

  const org = await p.org.create({ data: { name: 'acme' } });
  const secret = await p.team.create({ data: { orgId: org.id, name: 'secret' } });
  const sales = await p.team.create({ data: { orgId: org.id, name: 'sales' } });
  const collection = await p.collection.create({
    data: { name: 'secret-handbook', ownerScope: 'team', ownerId: secret.id, orgId: org.id },
  });

  // Tokens are principals of their own (a key reads what it was made a member of), so membership is per token.
  const member = async (role: 'OPERATOR' | 'VIEWER', name: string, teamId: string | null) => {
    const token = await t.token(role, name);
    const row = await p.apiToken.findFirstOrThrow({ where: { name } });
    if (teamId) await p.membership.create({ data: { orgId: org.id, teamId, apiTokenId: row.id } });
    return token;
  };
  who.memberViewer = { token: await member('VIEWER', 'secret-viewer', secret.id) };
  who.memberOperator = { token: await member('OPERATOR', 'secret-operator', secret.id) };
  who.outsideOperator = { token: await member('OPERATOR', 'sales-operator', sales.id) };
  who.outsideViewer = { token: await member('VIEWER', 'plain-viewer', null) };
  who.admin = { token: w.admin };

  // A person in the team, signed in to the console: the session reads as the user.
  const created = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { id } ... on Error { message } } }',
    { i: { email: 'ana@acme.example', name: 'Ana', role: 'OPERATOR', password: 'a-long-enough-password' } },
    { token: w.admin },
  );
  expect(created.data?.createUser.__typename).toBe('User');
  await p.membership.create({ data: { orgId: org.id, teamId: secret.id, userId: created.data?.createUser.id } });
  who.memberSession = { cookie: (await t.login('ana@acme.example', 'a-long-enough-password')).cookie };

  const other = await createNode('gpu-other');
  otherNode = other.token;
  const replica = await createNode('gpu-serving');
  replicaNode = replica.token;

  pairs = Array.from({ length: 6 }, (_, i) =>
    JSON.stringify({ q: `Secret ${i}?`, a: `Answer ${i}.`, collection: collection.id }),
  ).join('\n');
  const common = { model: 'tiny', baseRepo: 'hangar-test/tiny-llama', node: 'gpu-1', gpuMiB: 8000 };
  const owned = await trainAndPublish({ ...common, name: 'secret-adapter', data: pairs, params: { rank: 4 } });
  secretJob = owned.job;
  ownedSource = owned.source;
  const open = await trainAndPublish({
    ...common,
    name: 'public-adapter',
    public: true,
    data: '{"q":"1+1?","a":"2"}\n{"q":"2+2?","a":"4"}',
  });
  publicJob = open.job;
  publicSource = open.source;

  // gpu-serving holds a replica of tiny, whose replicas load its adapters.
  const tiny = await p.catalogModel.findUniqueOrThrow({ where: { name: 'tiny' } });
  await p.replica.create({ data: { modelId: tiny.id, nodeId: replica.id, desired: 'STOP' } });
}, 120_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

describe("an owned job's pairs (GET /api/train/jobs/<id>/data)", () => {
  const get = (id: string, c: { token?: string; cookie?: string }) =>
    fetch(`${base}/api/train/jobs/${id}/data`, { headers: headers(c) });

  it('are for the job node, operators the owner admits and admins: not an operator outside the team, nor another node', async () => {
    const expected: [string, { token?: string; cookie?: string }, number][] = [
      ['the job node', { token: w.nodeToken }, 200],
      ['an operator of the team', who.memberOperator as { token: string }, 200],
      ['a signed-in member of the team', who.memberSession as { cookie: string }, 200],
      ['an admin', who.admin as { token: string }, 200],
      ['an operator outside the team', who.outsideOperator as { token: string }, 403],
      ['a viewer of the team (viewers never read pairs)', who.memberViewer as { token: string }, 403],
      ['another node', { token: otherNode }, 403],
      ['nobody', {}, 401],
    ];
    for (const [label, c, status] of expected) {
      const r = await get(secretJob.id, c);
      expect(r.status, label).toBe(status);
      const text = await r.text();
      if (status === 200) expect(text, label).toContain('Secret 0?');
      else expect(text, label).not.toContain('Secret');
    }
  });

  it('of a public job stay readable by any operator, as before', async () => {
    expect((await get(publicJob.id, who.outsideOperator as { token: string })).status).toBe(200);
  });

  it("cannot be taken by naming an owned job's sha256 as another job's data", async () => {
    // Owned because the job says so, not because the pairs name a collection: the case the sha alone opened.
    const common = { model: 'tiny', baseRepo: 'hangar-test/tiny-llama', node: 'gpu-1', gpuMiB: 8000 };
    const data = '{"q":"Team-only 1?","a":"One."}\n{"q":"Team-only 2?","a":"Two."}';
    const made = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename
        ... on TrainJob { id dataSha256 owner } ... on Error { message } } }`,
      { i: { ...common, name: 'team-only', owner: 'team:acme/secret', data } },
      { token: who.memberOperator?.token },
    );
    expect(made.data?.createTrainJob).toMatchObject({ __typename: 'TrainJob', owner: expect.stringMatching(/^team:/) });
    const sha = made.data?.createTrainJob.dataSha256 as string;
    const reuse = (name: string, token: string | undefined) =>
      t.gql(CREATE, { i: { ...common, name, public: true, dataSha256: sha } }, { token });
    // Refused in the words of a missing upload: the refusal says nothing of whose pairs they are.
    expect((await reuse('borrowed', who.outsideOperator?.token)).data?.createTrainJob).toEqual({
      __typename: 'ValidationError',
      message: `no uploaded data has sha256 ${sha}: upload it with POST /api/train/data first`,
    });
    expect((await reuse('again', who.memberOperator?.token)).data?.createTrainJob).toMatchObject({
      __typename: 'TrainJob',
    });
  });

  it('are returned by no GraphQL field: the job shows only their count, size and sha256', async () => {
    const q = `query($id: ID!) { trainJob(id: $id) { pairs dataBytes dataSha256 events { message } artifacts { url files { name } } } }`;
    // A team member who may not read the pairs (a viewer) sees the job, not what it was trained on.
    const r = await t.gql(q, { id: secretJob.id }, { token: who.memberViewer?.token });
    expect(r.data?.trainJob.pairs).toBe(6);
    expect(JSON.stringify(r.data)).not.toMatch(/Secret|Answer/);
    // Anyone outside the team does not see the job at all (src/org/owned-metadata.test.ts).
    const outside = await t.gql(q, { id: secretJob.id }, { token: who.outsideOperator?.token });
    expect(outside.data?.trainJob).toBeNull();
  });
});

describe("an owned job's artifacts (GET /api/train/jobs/<id>/artifacts/<kind>)", () => {
  const get = (id: string, kind: string, c: { token?: string; cookie?: string }) =>
    fetch(`${base}/api/train/jobs/${id}/artifacts/${kind}`, { headers: headers(c) });

  it('are for those the owner admits, admins and the job node: not a viewer outside the team, nor another node', async () => {
    const expected: [string, { token?: string; cookie?: string }, number][] = [
      ['a viewer of the team', who.memberViewer as { token: string }, 200],
      ['a signed-in member of the team', who.memberSession as { cookie: string }, 200],
      ['an admin', who.admin as { token: string }, 200],
      ['the job node', { token: w.nodeToken }, 200],
      ['a viewer outside the team', who.outsideViewer as { token: string }, 403],
      ['an operator outside the team', who.outsideOperator as { token: string }, 403],
      ['another node', { token: otherNode }, 403],
      ['nobody', {}, 401],
    ];
    for (const kind of ['gguf', 'peft']) {
      for (const [label, c, status] of expected) {
        const r = await get(secretJob.id, kind, c);
        expect(r.status, `${kind}: ${label}`).toBe(status);
        const body = Buffer.from(await r.arrayBuffer());
        if (status === 200 && kind === 'gguf') expect(body.subarray(0, 4).toString(), label).toBe('GGUF');
        if (status !== 200) expect(body.subarray(0, 4).toString(), label).not.toBe('GGUF');
      }
    }
  });

  it('of a public job stay downloadable by any signed-in caller and any node, as before', async () => {
    for (const c of [who.outsideViewer, { token: otherNode }] as { token: string }[])
      expect((await get(publicJob.id, 'gguf', c)).status).toBe(200);
  });
});

describe('an owned adapter published into the mirror (GET /mirror/…)', () => {
  const get = (url: string, c: { token?: string; cookie?: string }, method = 'GET') =>
    fetch(url, { method, headers: headers(c) });

  it('is served to those the owner admits, admins, nodes that hold a replica of its model, and the server', async () => {
    const allowed: [string, { token?: string; cookie?: string }][] = [
      ['a viewer of the team', who.memberViewer as { token: string }],
      ['a signed-in member of the team', who.memberSession as { cookie: string }],
      ['an admin', who.admin as { token: string }],
      ['a node with a replica of tiny', { token: replicaNode }],
      ["the server's own pass", { token: t.app.services.mirror.internalToken }],
    ];
    for (const [label, c] of allowed) {
      const r = await get(ownedSource, c);
      expect(r.status, label).toBe(200);
      expect(r.headers.get('cache-control'), label).toMatch(/^private/);
      expect(
        Buffer.from(await r.arrayBuffer())
          .subarray(0, 4)
          .toString(),
        label,
      ).toBe('GGUF');
      // Its version's listing (what a vLLM node fetches a PEFT set by) follows the same rules.
      const list = await get(ownedSource.replace(/[^/]+$/, ''), c);
      expect(list.status, label).toBe(200);
      expect(list.headers.get('cache-control'), label).toMatch(/^private/);
      expect((await list.json()).files, label).toHaveLength(1);
    }
  });

  it('is, to anyone else, the same 404 as a file that does not exist', async () => {
    const missing = await get(ownedSource.replace(/[^/]+$/, 'no-such.gguf'), who.admin as { token: string });
    expect(missing.status).toBe(404);
    const nothing = await missing.text();
    const refused: [string, { token?: string }][] = [
      ['a viewer outside the team', who.outsideViewer as { token: string }],
      ['an operator outside the team', who.outsideOperator as { token: string }],
      ['the job node, which holds no replica of tiny', { token: w.nodeToken }],
      ['another node', { token: otherNode }],
    ];
    for (const [label, c] of refused) {
      for (const method of ['GET', 'HEAD']) {
        const r = await get(ownedSource, c, method);
        expect(r.status, `${method} ${label}`).toBe(404);
        expect(r.headers.get('etag'), label).toBeNull();
        if (method === 'GET') expect(await r.text(), label).toBe(nothing);
      }
      const list = await get(ownedSource.replace(/[^/]+$/, ''), c);
      expect(list.status, `listing ${label}`).toBe(404);
      expect(await list.text(), label).toBe('no such version in the mirror\n');
    }
  });

  it('is owned from the moment its file is in the mirror, before the adapter row exists', async () => {
    // publishTrainJob uploads into <name>/job-<first 8 of the id>/ and then creates the adapter: in between, the
    // job's owner is the file's. Put there by hand here, as that first step does.
    const { job } = await trainAndPublish(
      { model: 'tiny', baseRepo: 'hangar-test/tiny-llama', node: 'gpu-1', gpuMiB: 8000, name: 'not-yet', data: pairs },
      false,
    );
    const url = `${base}/mirror/${job.name}/job-${job.id.slice(0, 8)}/${job.name}.gguf`;
    const put = await fetch(url, {
      method: 'PUT',
      headers: { authorization: `Bearer ${w.admin}` },
      body: new Uint8Array(Buffer.from('GGUF not yet published')),
    });
    expect(put.status).toBe(201);
    expect(await t.app.db.prisma.adapter.count({ where: { name: job.name } })).toBe(0);
    expect((await get(url, who.outsideOperator as { token: string })).status).toBe(404);
    expect((await get(url, who.memberViewer as { token: string })).status).toBe(200);
  });

  it('needs a credential by default, as every mirror file does', async () => {
    expect((await get(ownedSource, {})).status).toBe(401);
    expect((await get(publicSource, {})).status).toBe(401);
    // A public adapter is served to any caller with a credential, as before.
    expect((await get(publicSource, who.outsideViewer as { token: string })).status).toBe(200);
  });

  it('is a 404 to anonymous callers of a mirror opened with HANGAR_MIRROR_REQUIRE_TOKEN=false', async () => {
    // The same handler the server mounts, with the setting off, on a socket of its own.
    const open = serveMirror({
      db: t.app.db.prisma,
      paths: t.app.services.mirror.paths,
      auth: t.app.services.auth,
      owners: t.app.services.org,
      requireToken: false,
      internalToken: t.app.services.mirror.internalToken,
      log: createLogger('silent'),
    });
    const server = http.createServer((req, res) => void open(req, res, (req.url ?? '/').split('?')[0] ?? '/'));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const at = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const path = (u: string) => new URL(u).pathname;
      expect((await get(`${at}${path(publicSource)}`, {})).status).toBe(200);
      const owned = await get(`${at}${path(ownedSource)}`, {});
      expect(owned.status).toBe(404);
      expect(await owned.text()).toBe('no such file in the mirror\n');
      expect((await get(`${at}${path(ownedSource)}`, who.memberViewer as { token: string })).status).toBe(200);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});
