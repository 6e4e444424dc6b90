import fs from 'node:fs/promises';
import { GraphqlControlPlane, newEngineKey } from '@hangar/agent/control-plane';
import { freePort } from '@hangar/common/free-port';
import {
  buildSchema,
  type GraphQLField,
  type GraphQLObjectType,
  getNamedType,
  isInterfaceType,
  isLeafType,
  isObjectType,
  isUnionType,
} from 'graphql';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// A replica's readiness through its own endpoint: the agent reports where it serves and its engine key, the
// control plane smoke-tests it there with the official OpenAI client and marks it READY (or FAILED, saying
// why). The node agent is played over GraphQL by the test and its endpoint by a stand-in on a real socket.

const KEY = 'hgk_serving-test-engine-key-0123456789abcdef';

let t: TestApp;
let operator: string;
let viewer: string;
let nodeToken: string;
let replica: StandInReplica;
let base: string;
const logged: string[] = [];

const REPLICA =
  'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename ... on Replica { state why: message } ... on Error { message } } }';
const ASSIGNED = '{ nodeAssignments { replicaId model desired parallel } }';
const report = (i: Record<string, unknown>) => t.gql(REPLICA, { i }, { token: nodeToken });

const heartbeat = () =>
  t.gql(
    'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
    {
      i: {
        gpus: [{ index: 0, name: 'H200', totalMiB: 143_771, freeMiB: 140_000 }],
        engines: [{ name: 'llama.cpp', build: 6000 }],
      },
    },
    { token: nodeToken },
  );

/** Puts `name` into the catalog and returns the id of the replica placed for it on the node. */
async function placed(name: string, extra = '') {
  const served = await t.gql(
    `mutation { serveMirrorVersion(model: "llama-vocab", version: "v1", name: "${name}"${extra}) { __typename ... on Error { message } } }`,
    {},
    { token: operator },
  );
  expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
  await heartbeat();
  await t.app.services.fleet.place();
  const mine = (await t.gql(ASSIGNED, {}, { token: nodeToken })).data?.nodeAssignments ?? [];
  const a = mine.find((x: { model: string }) => x.model === name);
  expect(a).toBeTruthy();
  return a as { replicaId: string; parallel: number };
}

const REPLICA_FIELDS =
  'state message smokeText tokensPerSecond timeToFirstTokenMs smokedAt endpoint gpuLayers totalLayers vramUsedBytes';

async function replicaOf(name: string, token = operator) {
  const r = await t.gql(
    `query($n: String!) { model(name: $n) { replicas { ${REPLICA_FIELDS} } } }`,
    { n: name },
    { token },
  );
  // A viewer gets null for the endpoint, not an error that would cost it the rest of the page.
  expect(r.errors).toBeUndefined();
  return r.data?.model.replicas[0];
}

/** Waits for the control plane's smoke test to decide (it runs after the report is answered). */
async function settled(name: string) {
  const end = Date.now() + 20_000;
  for (;;) {
    const r = await replicaOf(name);
    if (r && r.state !== 'LOADING') return r;
    if (Date.now() > end) throw new Error(`the smoke test did not decide: ${JSON.stringify(r)}`);
    await new Promise((res) => setTimeout(res, 50));
  }
}

beforeAll(async () => {
  // Every log line of the server, at debug, to look for the key in.
  const write = process.stderr.write.bind(process.stderr);
  vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array, ...rest: unknown[]) => {
    logged.push(String(chunk));
    return (write as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
  });
  replica = await startStandInReplica({ key: KEY, model: 'served' });
  t = await startTestApp({ HANGAR_LOG_LEVEL: 'debug' });
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'serving-ops');
  viewer = await t.token('VIEWER', 'serving-viewer');
  const admin = await t.token('ADMIN', 'serving-admin');
  nodeToken = (
    await t.gql('mutation { createNode(name: "gpu-9") { ... on CreatedNode { token } } }', {}, { token: admin })
  ).data?.createNode.token;
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
  await replica.close();
  vi.restoreAllMocks();
});

describe('a replica is ready when a request through its endpoint answers', () => {
  it('keeps the endpoint and key the agent reports, smoke-tests there, and is READY with the answer', async () => {
    const { replicaId, parallel } = await placed('served', ', parallel: 4');
    expect(parallel).toBe(4);
    const r = await report({
      replicaId,
      state: 'READY',
      message: 'loaded with a 4096-token context',
      endpoint: replica.endpoint,
      engineKey: KEY,
      gpuLayers: 33,
      totalLayers: 33,
      vramUsedBytes: 3_000_000_000,
    });
    // Not READY on the agent's word: LOADING until the control plane's own request answers.
    expect(r.data?.reportReplica).toMatchObject({
      state: 'LOADING',
      why: 'loaded with a 4096-token context',
    });
    const ready = await settled('served');
    expect(ready).toMatchObject({
      state: 'READY',
      smokeText: ' Hello there!',
      endpoint: replica.endpoint,
      gpuLayers: 33,
      totalLayers: 33,
      vramUsedBytes: 3_000_000_000,
      smokedAt: expect.any(String),
    });
    expect(ready.tokensPerSecond).toBeGreaterThan(0);
    expect(ready.timeToFirstTokenMs).toBeGreaterThan(0);
    expect(replica.requests.at(-1)).toMatchObject({
      authorization: `Bearer ${KEY}`,
      body: { model: 'served', max_tokens: 8 },
    });
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'smokeTest' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({ actor: expect.stringMatching(/smoke test/), target: 'served' });
    expect(audit?.message).toMatch(/^gpu-9: ready: answered in \d+ ms to the first token, [\d.]+ tokens\/s$/);
  });

  it('shows the endpoint to operators and not to viewers', async () => {
    expect((await replicaOf('served', viewer)).endpoint).toBeNull();
    expect((await replicaOf('served', operator)).endpoint).toBe(replica.endpoint);
  });

  it("keeps the measured memory next to the plan's estimate, as the estimate's error", async () => {
    const m = (
      await t.gql(
        '{ model(name: "served") { memoryBytes measuredMemoryBytes measuredAt memoryEstimateError } }',
        {},
        {
          token: viewer,
        },
      )
    ).data?.model;
    expect(m.measuredMemoryBytes).toBe(3_000_000_000);
    expect(m.measuredAt).toEqual(expect.any(String));
    expect(m.memoryEstimateError).toBeCloseTo((3_000_000_000 - m.memoryBytes) / m.memoryBytes, 3);
  });

  it('fails a replica whose endpoint refuses its key, saying so, and keeps that when the agent stops it', async () => {
    const { replicaId } = await placed('wrong-key');
    const wrong = 'hgk_a-key-the-endpoint-does-not-take-0123456789';
    await report({ replicaId, state: 'READY', endpoint: replica.endpoint, engineKey: wrong });
    const failed = await settled('wrong-key');
    expect(failed.state).toBe('FAILED');
    expect(failed.message).toMatch(/^smoke test: .*\/v1\/chat\/completions refused the engine key \(HTTP 401/);
    expect(failed.message).not.toContain(wrong);
    expect(await t.app.db.prisma.engineKey.findUnique({ where: { replicaId } })).toBeNull();
    // No longer assigned, the agent stops it and says so: the reason it failed is what stays.
    await report({ replicaId, state: 'STOPPED', message: 'no longer assigned to this node' });
    expect(await replicaOf('wrong-key')).toMatchObject({ state: 'FAILED', message: failed.message });
  });

  it('fails a replica whose endpoint nothing answers on', async () => {
    const { replicaId } = await placed('down');
    const port = await freePort();
    await report({ replicaId, state: 'READY', endpoint: `http://127.0.0.1:${port}/v1`, engineKey: KEY });
    const failed = await settled('down');
    expect(failed).toMatchObject({ state: 'FAILED' });
    expect(failed.message).toMatch(/could not reach http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions \(ECONNREFUSED\)/);
  });

  it('records READY without an endpoint as FAILED: nothing could reach it', async () => {
    const { replicaId } = await placed('no-endpoint');
    const r = await report({ replicaId, state: 'READY', smokeText: ' hi', tokensPerSecond: 9 });
    expect(r.data?.reportReplica).toMatchObject({
      state: 'FAILED',
      why: expect.stringMatching(/reported it ready without an endpoint and an engine key, so no request can reach it/),
    });
  });

  it('refuses an endpoint no node serves on, and a key that is not one', async () => {
    const { replicaId } = await placed('bad-endpoint');
    const meta = await report({ replicaId, state: 'READY', endpoint: 'http://169.254.169.254/v1', engineKey: KEY });
    expect(meta.data?.reportReplica).toMatchObject({
      __typename: 'ValidationError',
      message: expect.stringMatching(/^input\.endpoint: 169\.254\.169\.254 is an unspecified, link-local or multicast/),
    });
    const short = await report({ replicaId, state: 'READY', endpoint: replica.endpoint, engineKey: 'hgk_ab cd' });
    expect(short.data?.reportReplica.message).toMatch(/^input\.engineKey: 16 to 512 printable characters/);
    expect(short.data?.reportReplica.message).not.toContain('hgk_ab cd');
  });

  it("takes the agent's own client's report, over HTTP with the node token, and reads parallel from it", async () => {
    const key = newEngineKey();
    expect(key).toMatch(/^hgk_[A-Za-z0-9_-]{43}$/);
    const other = await startStandInReplica({ key, model: 'by-agent' });
    try {
      await placed('by-agent', ', parallel: 2');
      const agent = new GraphqlControlPlane(base, nodeToken);
      const a = (await agent.assignments()).find((x) => x.model === 'by-agent');
      expect(a).toMatchObject({ parallel: 2, desired: 'RUN' });
      await agent.reportReplica({
        replicaId: a?.replicaId ?? '',
        state: 'READY',
        endpoint: other.endpoint,
        engineKey: key,
        gpuLayers: 10,
        totalLayers: 33,
        vramUsedBytes: 1_000_000_000,
      });
      expect(await settled('by-agent')).toMatchObject({ state: 'READY', gpuLayers: 10, smokeText: ' Hello there!' });
      expect(other.requests.at(-1)?.authorization).toBe(`Bearer ${key}`);
      // Partly offloaded, what the card holds is not the model's need: the estimate is left unjudged.
      const m = (
        await t.gql('{ model(name: "by-agent") { measuredMemoryBytes memoryEstimateError } }', {}, { token: viewer })
      ).data?.model;
      expect(m).toEqual({ measuredMemoryBytes: null, memoryEstimateError: null });
    } finally {
      await other.close();
    }
  });

  it('forgets the old endpoint and key of a replica that loads again, and tests the new ones', async () => {
    const { replicaId } = await placed('reload');
    const first = await startStandInReplica({ key: KEY, model: 'reload' });
    const key2 = newEngineKey();
    const second = await startStandInReplica({ key: key2, model: 'reload' });
    try {
      await report({ replicaId, state: 'READY', endpoint: first.endpoint, engineKey: KEY });
      expect((await settled('reload')).state).toBe('READY');
      // Its agent restarted: loading again, on a new port with a new key.
      await first.close();
      await report({ replicaId, state: 'LOADING', message: 'fetching the model' });
      expect(await t.app.db.prisma.engineKey.findUnique({ where: { replicaId } })).toBeNull();
      await t.app.services.fleet.smokeDue();
      expect(await replicaOf('reload')).toMatchObject({ state: 'LOADING', message: 'fetching the model' });
      await report({ replicaId, state: 'READY', endpoint: second.endpoint, engineKey: key2 });
      expect(await settled('reload')).toMatchObject({ state: 'READY', endpoint: second.endpoint });
      expect(second.requests.at(-1)?.authorization).toBe(`Bearer ${key2}`);
    } finally {
      await first.close().catch(() => {});
      await second.close();
    }
  });

  it('keeps the adapters a replica reports, follows them while it serves, and keeps them when a report says none', async () => {
    const { replicaId } = await placed('with-adapters');
    const adaptersOf = async () =>
      (await t.app.db.prisma.replica.findUniqueOrThrow({ where: { id: replicaId } })).adapters;
    await report({ replicaId, state: 'LOADING', message: 'fetching the model', adapters: [] });
    const own = await startStandInReplica({ key: KEY, model: 'with-adapters' });
    try {
      await report({
        replicaId,
        state: 'READY',
        message: 'loaded',
        endpoint: own.endpoint,
        engineKey: KEY,
        adapters: ['wa-one'],
      });
      const ready = await settled('with-adapters');
      expect(ready.state).toBe('READY');
      expect(await adaptersOf()).toEqual(['wa-one']);
      const shown = await t.gql('{ model(name: "with-adapters") { replicas { adapters } } }', {}, { token: viewer });
      expect(shown.data?.model.replicas).toEqual([{ adapters: ['wa-one'] }]);

      // Its agent loaded one published since, through its own client: the replica stays READY, not tested again.
      const smokes = own.requests.length;
      const agent = new GraphqlControlPlane(base, nodeToken);
      await agent.reportReplica({
        replicaId,
        state: 'READY',
        message: 'loaded; adapters: wa-one (8 tokens), wa-two (8 tokens)',
        endpoint: own.endpoint,
        engineKey: KEY,
        adapters: ['wa-one', 'wa-two'],
      });
      expect(await adaptersOf()).toEqual(['wa-one', 'wa-two']);
      expect(await replicaOf('with-adapters')).toMatchObject({
        state: 'READY',
        smokedAt: ready.smokedAt,
        message: 'loaded; adapters: wa-one (8 tokens), wa-two (8 tokens)',
      });
      await t.app.services.fleet.smokeDue();
      expect(own.requests.length).toBe(smokes);

      // An agent from before adapters were reported says nothing of them: what was reported stays.
      await report({ replicaId, state: 'READY', endpoint: own.endpoint, engineKey: KEY });
      expect(await adaptersOf()).toEqual(['wa-one', 'wa-two']);
      const bad = await report({
        replicaId,
        state: 'READY',
        endpoint: own.endpoint,
        engineKey: KEY,
        adapters: ['a b'],
      });
      expect(bad.data?.reportReplica.message).toMatch(/^input\.adapters\.0: an adapter name is letters, digits/);
      expect(await adaptersOf()).toEqual(['wa-one', 'wa-two']);

      await agent.reportReplica({ replicaId, state: 'STOPPED', message: 'stopped', adapters: [] });
      expect(await adaptersOf()).toEqual([]);
    } finally {
      await own.close();
    }
  });

  it('sets how many requests a replica answers at once, 1 to 64', async () => {
    const set = await t.gql(
      'mutation { setModelMode(name: "served", mode: ALWAYS, parallel: 8) { __typename ... on Model { parallel } } }',
      {},
      { token: operator },
    );
    expect(set.data?.setModelMode).toEqual({ __typename: 'Model', parallel: 8 });
    const bad = await t.gql(
      'mutation { setModelMode(name: "served", mode: ALWAYS, parallel: 65) { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(bad.data?.setModelMode).toEqual({
      __typename: 'ValidationError',
      message: 'parallel: at most 64 requests at once',
    });
    const mine = (await t.gql(ASSIGNED, {}, { token: nodeToken })).data?.nodeAssignments ?? [];
    expect(mine.find((a: { model: string }) => a.model === 'served')?.parallel).toBe(8);
  });

  it('never answers the engine key in any field, nor writes it to a log line', async () => {
    // Every field reachable from the queries an operator or a viewer has (without arguments), three levels deep.
    // The printed schema (a test fails when it drifts from the built one), read with this file's graphql.
    const printed = buildSchema(await fs.readFile(new URL('../../schema.graphql', import.meta.url), 'utf8'));
    const query = printed.getQueryType() as GraphQLObjectType;
    const answers: string[] = [];
    for (const token of [operator, viewer, nodeToken]) {
      // One query per top-level field: a field refused to this caller must not hide the others' answers.
      for (const field of selection(query, 0, true))
        answers.push(JSON.stringify(await t.gql(`{ ${field} }`, {}, { token })));
    }
    expect(answers.some((a) => a.includes('Hello there!') && a.includes(replica.endpoint))).toBe(true);
    expect(answers.filter((a) => a.includes('hgk_'))).toEqual([]);
    const audit = await t.app.db.prisma.auditEvent.findMany();
    expect(JSON.stringify(audit, (_k, v) => (typeof v === 'bigint' ? String(v) : v))).not.toContain('hgk_');
    expect(logged.length).toBeGreaterThan(0);
    expect(logged.filter((l) => l.includes('hgk_'))).toEqual([]);
  });
});

/** A selection of every argument-free field, leaves and objects, down to depth 3 (top: one string per field). */
function selection(type: GraphQLObjectType, depth: number, top = false): string[] {
  const fields = Object.values(type.getFields()).filter((f: GraphQLField<unknown, unknown>) =>
    f.args.every((a) => !a.type.toString().endsWith('!')),
  );
  const parts: string[] = [];
  for (const f of fields) {
    if (f.name.startsWith('__')) continue;
    const named = getNamedType(f.type);
    if (isLeafType(named)) parts.push(f.name);
    else if (depth < 3 && isObjectType(named)) {
      const inner = selection(named, depth + 1).join(' ');
      if (inner) parts.push(`${f.name} { ${inner} }`);
    } else if (depth < 3 && (isUnionType(named) || isInterfaceType(named))) {
      parts.push(`${f.name} { __typename }`);
    }
  }
  return top ? parts : [parts.join(' ')];
}
