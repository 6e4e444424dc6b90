import fs from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// The control plane's side of the fleet, with a node agent played over GraphQL by the test (the real agent
// speaks the same operations): reports, assignments, replica states, a node that goes away.

let t: TestApp;
let operator: string;
let endpoint: StandInReplica;
const KEY = 'hgk_fleet-test-engine-key-0123456789abcdefgh';
const nodeTokens: Record<string, string> = {};

const REPORT = 'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }';
const ASSIGNED = '{ nodeAssignments { replicaId model engine source contextSize desired } }';
const REPLICA =
  'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename ... on Replica { state } ... on Error { message } } }';
const MODEL =
  '{ model(name: "llama-7b") { mode replicas { state desired message smokeText tokensPerSecond node { name } } } }';

const heartbeat = (name: string, freeMiB: number) =>
  t.gql(
    REPORT,
    {
      i: {
        gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB }],
        engines: [{ name: 'llama.cpp', build: 6000 }],
      },
    },
    { token: nodeTokens[name] },
  );

beforeAll(async () => {
  endpoint = await startStandInReplica({ key: KEY, model: 'llama-7b' });
  t = await startTestApp();
  const base = await t.app.start();
  operator = await t.token('OPERATOR', 'fleet-ops');
  const admin = await t.token('ADMIN', 'fleet-admin');
  for (const name of ['gpu-1', 'gpu-2']) {
    nodeTokens[name] = (
      await t.gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`, {}, { token: admin })
    ).data?.createNode.token;
  }
  const body = await fs.readFile(
    new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
  );
  await fetch(`${base}/mirror/llama-vocab/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${operator}` },
    body: new Uint8Array(body),
  });
});
afterAll(async () => {
  await t.close();
  await endpoint.close();
});

describe('placement over real nodes', () => {
  it('says why a replica waits when no node has room, then places it when one does', async () => {
    await heartbeat('gpu-1', 1000);
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "llama-vocab", version: "v1", name: "llama-7b") { __typename } }',
      {},
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    await t.app.services.fleet.place();
    const waiting = await t.gql(MODEL, {}, { token: operator });
    expect(waiting.data?.model.replicas).toEqual([
      {
        state: 'PENDING',
        desired: 'RUN',
        message: expect.stringMatching(
          /^fits on no node: needs 2\.5 GiB, the most room is 0\.0 GiB on gpu-1 GPU 0 \(of 24\.0 GiB: 23\.0 GiB in use outside Hangar, 2\.4 GiB kept free by HANGAR_GPU_MEMORY_MARGIN\)\. It is placed once /,
        ),
        smokeText: null,
        tokensPerSecond: null,
        node: null,
      },
    ]);
    await heartbeat('gpu-2', 20_000);
    await t.app.services.fleet.place();
    const placed = await t.gql(MODEL, {}, { token: operator });
    expect(placed.data?.model.replicas).toMatchObject([{ state: 'PENDING', node: { name: 'gpu-2' }, message: null }]);
  });

  it("gives the node's agent its assignment, and takes its reports", async () => {
    expect((await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments).toEqual([]);
    const mine = (await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-2'] })).data?.nodeAssignments;
    expect(mine).toMatchObject([{ model: 'llama-7b', engine: 'llamacpp', desired: 'RUN', contextSize: 4096 }]);
    expect(mine[0].source).toMatch(/\/mirror\/llama-vocab\/v1\/model\.gguf$/);
    const id = mine[0].replicaId;
    expect(
      (await t.gql(REPLICA, { i: { replicaId: id, state: 'LOADING' } }, { token: nodeTokens['gpu-2'] })).data
        ?.reportReplica.state,
    ).toBe('LOADING');
    await t.gql(
      REPLICA,
      { i: { replicaId: id, state: 'READY', endpoint: endpoint.endpoint, engineKey: KEY } },
      { token: nodeTokens['gpu-2'] },
    );
    // READY once the control plane's smoke test through the endpoint has answered (serving.test.ts has more).
    let ready = await t.gql(MODEL, {}, { token: operator });
    for (let i = 0; i < 200 && ready.data?.model.replicas[0].state === 'LOADING'; i++) {
      await new Promise((r) => setTimeout(r, 50));
      ready = await t.gql(MODEL, {}, { token: operator });
    }
    expect(ready.data?.model.replicas).toMatchObject([
      { state: 'READY', smokeText: ' Hello there!', node: { name: 'gpu-2' } },
    ]);
    const tps = ready.data?.model.replicas[0].tokensPerSecond;
    expect(tps).toBeGreaterThan(0);
    // Another node cannot report on it.
    const other = await t.gql(REPLICA, { i: { replicaId: id, state: 'FAILED' } }, { token: nodeTokens['gpu-1'] });
    expect(other.data?.reportReplica).toEqual({
      __typename: 'NotFoundError',
      message: `no replica ${id} is assigned to node gpu-1`,
    });
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'reportReplica', outcome: 'DONE' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({
      actor: 'node:gpu-2',
      target: 'llama-7b',
      message: `serving on ${endpoint.endpoint}; smoke test due`,
    });
  });

  it('shows the replica of a vanished node as lost and places another', async () => {
    await t.app.db.prisma.node.update({
      where: { name: 'gpu-2' },
      data: { lastSeenAt: new Date(Date.now() - 120_000) },
    });
    await heartbeat('gpu-1', 20_000);
    await t.app.services.fleet.place();
    const after = await t.gql(MODEL, {}, { token: operator });
    expect(after.data?.model.replicas).toMatchObject([
      { state: 'LOST', message: 'node gpu-2 stopped reporting', node: { name: 'gpu-2' } },
      { state: 'PENDING', node: { name: 'gpu-1' } },
    ]);
  });

  it('asks the agent to stop replicas of a stopped model', async () => {
    const [pending] = (await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments ?? [];
    await t.gql(REPLICA, { i: { replicaId: pending.replicaId, state: 'LOADING' } }, { token: nodeTokens['gpu-1'] });
    await t.gql('mutation { setModelMode(name: "llama-7b", mode: STOPPED) { __typename } }', {}, { token: operator });
    await t.app.services.fleet.place();
    expect((await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments).toMatchObject([
      { replicaId: pending.replicaId, desired: 'STOP' },
    ]);
    await t.gql(REPLICA, { i: { replicaId: pending.replicaId, state: 'STOPPED' } }, { token: nodeTokens['gpu-1'] });
    expect((await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments).toEqual([]);
  });

  it('wakes an on-demand model, and refuses to wake one that is not', async () => {
    const notOnDemand = await t.gql(
      'mutation { wakeModel(name: "llama-7b") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(notOnDemand.data?.wakeModel).toEqual({
      __typename: 'ConflictError',
      message: 'llama-7b is stopped, not on demand: only an on-demand model is woken',
    });
    await t.gql('mutation { setModelMode(name: "llama-7b", mode: ON_DEMAND) { __typename } }', {}, { token: operator });
    await t.app.services.fleet.place();
    const asleep = (await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments;
    expect(asleep).toEqual([]);
    const woken = await t.gql(
      'mutation { wakeModel(name: "llama-7b") { __typename ... on Model { awakeUntil } } }',
      {},
      { token: operator },
    );
    expect(woken.data?.wakeModel.__typename).toBe('Model');
    await t.app.services.fleet.place();
    expect((await t.gql(ASSIGNED, {}, { token: nodeTokens['gpu-1'] })).data?.nodeAssignments).toMatchObject([
      { model: 'llama-7b', desired: 'RUN' },
    ]);
  });
});
