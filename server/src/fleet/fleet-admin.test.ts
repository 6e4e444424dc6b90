import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { onLocalNotify } from '../pubsub.js';

// Removing nodes and changing their tokens, with node agents played over GraphQL by the test (the real agent
// speaks the same operations; test/fleet-agent.test.ts runs one): what is refused and why, what force does to
// the replicas and training jobs a node holds, and a token that stops working the moment it is replaced.

let t: TestApp;
let admin: string;
let operator: string;
const tokens: Record<string, string> = {};
/** A played agent's node token (set by addNode). */
const tok = (name: string) => tokens[name] ?? '';

const db = () => t.app.db.prisma;
const CREATE = 'mutation($n: String!) { createNode(name: $n) { ... on CreatedNode { token } } }';
const REMOVE = `mutation($n: String!, $f: Boolean) { removeNode(name: $n, force: $f) { __typename
  ... on RemovedNode { name message } ... on Error { message } } }`;
const ROTATE = `mutation($n: String!) { rotateNodeToken(name: $n) { __typename
  ... on CreatedNode { token agentCommand node { name online } } ... on Error { message } } }`;
const REVOKE = `mutation($n: String!) { revokeNodeToken(name: $n) { __typename
  ... on Node { name online tokenRevoked } ... on Error { message } } }`;
const REPLICA =
  'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename ... on Error { message } } }';

const heartbeat = (token: string) =>
  t.gql(
    'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename ... on Error { message } } }',
    {
      i: {
        gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20_000 }],
        engines: [{ name: 'llama.cpp', build: 6000 }],
      },
    },
    { token },
  );
const addNode = async (name: string) => {
  tokens[name] = (await t.gql(CREATE, { n: name }, { token: admin })).data?.createNode.token;
  expect((await heartbeat(tok(name))).data?.reportNode.__typename).toBe('Node');
};
const assignments = async (name: string) =>
  (await t.gql('{ nodeAssignments { replicaId model desired } }', {}, { token: tok(name) })).data?.nodeAssignments as {
    replicaId: string;
    model: string;
    desired: string;
  }[];
const audit = (action: string) => db().auditEvent.findFirst({ where: { action }, orderBy: { id: 'desc' } });
const trainJob = (name: string, nodeName: string, state: 'QUEUED' | 'RUNNING') =>
  db()
    .node.findUniqueOrThrow({ where: { name: nodeName } })
    .then((node) =>
      db().trainJob.create({
        data: {
          name,
          model: 'small',
          baseRepo: 'hangar-test/base',
          nodeId: node.id,
          gpuMiB: 8000,
          dataPath: '/nonexistent',
          dataSha256: 'a'.repeat(64),
          dataBytes: 1,
          pairs: 1,
          state,
          ...(state === 'RUNNING' ? { leaseOwner: node.id, leaseUntil: new Date(Date.now() + 60_000) } : {}),
        },
      }),
    );

beforeAll(async () => {
  t = await startTestApp();
  await t.app.start();
  admin = await t.token('ADMIN', 'nodes-admin');
  operator = await t.token('OPERATOR', 'nodes-operator');
  await db().catalogModel.create({
    data: {
      name: 'small',
      source: 'http://mirror.invalid/small/v1/m.gguf',
      engine: 'llamacpp',
      memoryBytes: 2n ** 30n,
    },
  });
});
afterAll(() => t.close());

describe('removing a node', () => {
  it('removes a node that holds nothing, and its token is refused from then', async () => {
    await t.gql(CREATE, { n: 'never-seen' }, { token: admin }).then((r) => {
      tokens['never-seen'] = r.data?.createNode.token;
    });
    const r = await t.gql(REMOVE, { n: 'never-seen' }, { token: admin });
    expect(r.data?.removeNode).toEqual({
      __typename: 'RemovedNode',
      name: 'never-seen',
      message: 'removed node never-seen. An agent still running there is refused: stop it',
    });
    expect(await db().node.findUnique({ where: { name: 'never-seen' } })).toBeNull();
    expect((await heartbeat(tok('never-seen'))).data?.reportNode.__typename).toBe('UnauthenticatedError');
    expect(await audit('removeNode')).toMatchObject({
      actor: 'token:nodes-admin (admin@example.com)',
      target: 'never-seen',
      outcome: 'DONE',
    });
  });

  it('is for admins, and says when there is no such node', async () => {
    expect((await t.gql(REMOVE, { n: 'gpu-x' }, { token: operator })).data?.removeNode.__typename).toBe(
      'ForbiddenError',
    );
    expect((await t.gql(REMOVE, { n: 'gpu-x' }, { token: admin })).data?.removeNode).toEqual({
      __typename: 'NotFoundError',
      message: 'no node gpu-x: see Nodes for the names',
    });
  });

  it('refuses while the node runs a replica or a training job, naming them, and changes nothing', async () => {
    await addNode('busy');
    await t.app.services.fleet.place();
    const [mine = { replicaId: '', model: '', desired: '' }] = await assignments('busy');
    expect(mine).toMatchObject({ model: 'small', desired: 'RUN' });
    await t.gql(REPLICA, { i: { replicaId: mine.replicaId, state: 'LOADING' } }, { token: tokens.busy });
    await trainJob('busy-adapter', 'busy', 'RUNNING');
    const r = await t.gql(REMOVE, { n: 'busy' }, { token: admin });
    expect(r.data?.removeNode).toEqual({
      __typename: 'ConflictError',
      message:
        'node busy still runs 1 replica (small) and training job busy-adapter: stop its agent first (its replicas drain: they finish their requests and are placed on other nodes) and cancel the job, or remove it with force, which cuts the requests in flight there, places its replicas on other nodes and fails the job',
    });
    expect(await db().node.findUnique({ where: { name: 'busy' } })).not.toBeNull();
    expect(await db().replica.findUnique({ where: { id: mine.replicaId } })).toMatchObject({ state: 'LOADING' });
    expect(await audit('removeNode')).toMatchObject({ target: 'busy', outcome: 'REFUSED' });
  });

  it('with force, deletes its replicas (placed again elsewhere) and fails its jobs, saying so', async () => {
    await addNode('spare');
    await trainJob('queued-adapter', 'busy', 'QUEUED');
    const [mine = { replicaId: '' }] = await assignments('busy');
    const r = await t.gql(REMOVE, { n: 'busy', f: true }, { token: admin });
    expect(r.data?.removeNode).toEqual({
      __typename: 'RemovedNode',
      name: 'busy',
      message:
        'removed node busy: 1 replica of small deleted, placed again on other nodes; training job busy-adapter, queued-adapter failed ("node busy was removed"). An agent still running there is refused: stop it',
    });
    expect(await db().replica.findUnique({ where: { id: mine.replicaId } })).toBeNull();
    const jobs = await db().trainJob.findMany({
      where: { name: { in: ['busy-adapter', 'queued-adapter'] } },
      orderBy: { name: 'asc' },
    });
    expect(jobs.map((j) => [j.name, j.state, j.message, j.leaseOwner])).toEqual([
      ['busy-adapter', 'FAILED', 'node busy was removed', null],
      ['queued-adapter', 'FAILED', 'node busy was removed', null],
    ]);
    await t.app.services.fleet.place();
    expect(await assignments('spare')).toMatchObject([{ model: 'small', desired: 'RUN' }]);
  });

  it("with force, fails its jobs the training domain's way: each job's event log says why, and its node's agent is told", async () => {
    await addNode('leaving');
    const running = await trainJob('leaving-running', 'leaving', 'RUNNING');
    const queued = await trainJob('leaving-queued', 'leaving', 'QUEUED');
    const heard: [string, string][] = [];
    const stop = onLocalNotify((topic, id) => heard.push([topic, id]));
    try {
      const r = await t.gql(REMOVE, { n: 'leaving', f: true }, { token: admin });
      expect(r.data?.removeNode.__typename).toBe('RemovedNode');
    } finally {
      stop();
    }
    for (const job of [running, queued]) {
      const events = await db().trainEvent.findMany({ where: { jobId: job.id }, orderBy: { at: 'asc' } });
      expect(events.map((e) => [e.level, e.message])).toEqual([['error', 'failed: node leaving was removed']]);
      expect(heard).toContainEqual(['trainJob', job.id]);
    }
    expect(heard).toContainEqual(['trainWork', running.nodeId]);
  });
});

describe("a node's token", () => {
  it('rotated: the old one is refused at once, the new one works, with the command to start the agent', async () => {
    const old = tok('spare');
    // Used just before, as an agent would every few seconds.
    expect((await heartbeat(old)).data?.reportNode.__typename).toBe('Node');
    const r = await t.gql(ROTATE, { n: 'spare' }, { token: admin });
    const rotated = r.data?.rotateNodeToken;
    expect(rotated).toMatchObject({ __typename: 'CreatedNode', node: { name: 'spare', online: true } });
    expect(rotated.token).toMatch(/^hgn_/);
    expect(rotated.token).not.toBe(old);
    expect(rotated.agentCommand).toContain(`HANGAR_NODE_TOKEN=${rotated.token} `);
    const refused = await heartbeat(old);
    expect(refused.data?.reportNode.__typename).toBe('UnauthenticatedError');
    expect((await t.gql('{ nodeAssignments { replicaId } }', {}, { token: old })).errors?.[0]?.message).toBeTruthy();
    expect((await heartbeat(rotated.token)).data?.reportNode.__typename).toBe('Node');
    tokens.spare = rotated.token;
    expect(await audit('rotateNodeToken')).toMatchObject({ target: 'spare', outcome: 'DONE' });
  });

  it('revoked: refused at once, the node offline and its replicas placed elsewhere; rotating gives it a new one', async () => {
    await addNode('other');
    const [mine = { replicaId: '' }] = await assignments('spare');
    await t.gql(REPLICA, { i: { replicaId: mine.replicaId, state: 'LOADING' } }, { token: tokens.spare });
    const r = await t.gql(REVOKE, { n: 'spare' }, { token: admin });
    expect(r.data?.revokeNodeToken).toEqual({ __typename: 'Node', name: 'spare', online: false, tokenRevoked: true });
    expect((await heartbeat(tok('spare'))).data?.reportNode.__typename).toBe('UnauthenticatedError');
    await t.app.services.fleet.place();
    expect(await db().replica.findUniqueOrThrow({ where: { id: mine.replicaId } })).toMatchObject({ state: 'LOST' });
    expect(await assignments('other')).toMatchObject([{ model: 'small', desired: 'RUN' }]);
    expect(await audit('revokeNodeToken')).toMatchObject({ target: 'spare', outcome: 'DONE' });
    const again = (await t.gql(ROTATE, { n: 'spare' }, { token: admin })).data?.rotateNodeToken;
    expect((await heartbeat(again.token)).data?.reportNode.__typename).toBe('Node');
    const nodes = (await t.gql('{ nodes { name online tokenRevoked } }', {}, { token: admin })).data?.nodes;
    expect(nodes).toContainEqual({ name: 'spare', online: true, tokenRevoked: false });
  });
});

describe('waking a model whose replica is being stopped', () => {
  it('keeps the replica its agent has not stopped yet, rather than starting a cold one', async () => {
    await db().catalogModel.update({ where: { name: 'small' }, data: { minReplicas: 0, maxReplicas: 0 } });
    await t.app.services.fleet.place();
    await db().catalogModel.create({
      data: {
        name: 'sleepy',
        source: 'http://mirror.invalid/sleepy/v1/m.gguf',
        engine: 'llamacpp',
        memoryBytes: 2n ** 30n,
        minReplicas: 0,
        maxReplicas: 1,
        awakeUntil: new Date(Date.now() + 60_000),
      },
    });
    await t.app.services.fleet.place();
    const mine = (await assignments('other')).find((a) => a.model === 'sleepy');
    expect(mine).toBeTruthy();
    const id = mine?.replicaId as string;
    await db().replica.update({ where: { id }, data: { state: 'READY' } });
    // Its idle time runs out: it drains first (fleet/drain.ts), taking no new requests, before its agent is asked
    // to stop it.
    await db().catalogModel.update({ where: { name: 'sleepy' }, data: { awakeUntil: new Date(Date.now() - 1000) } });
    await t.app.services.fleet.place();
    expect(await db().replica.findUniqueOrThrow({ where: { id } })).toMatchObject({
      desired: 'RUN',
      state: 'READY',
      drainingSince: expect.any(Date),
    });
    const woken = await t.gql('mutation { wakeModel(name: "sleepy") { __typename } }', {}, { token: operator });
    expect(woken.data?.wakeModel.__typename).toBe('Model');
    await t.app.services.fleet.place();
    const rows = await db().replica.findMany({ where: { model: { name: 'sleepy' } } });
    expect(rows.map((r) => [r.id, r.state, r.desired, r.drainingSince])).toEqual([[id, 'READY', 'RUN', null]]);
    expect(await assignments('other')).toContainEqual({ replicaId: id, model: 'sleepy', desired: 'RUN' });
  });
});
