import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PLACEMENT_LOCK } from '../src/fleet/fleet-placement.js';
import { startTestApp, type TestApp } from './harness.js';

// A fleet as an operator changes it, with a real node agent running real llama.cpp (CPU) on the tiny llama: an
// agent declaring two GPUs gets a replica on each, the model card shows the replicas as they stand through a day
// of mode changes, setting a serving model on demand and waking it keeps the warm replica, and an agent that
// stops says so and its node is offline at once.

let t: TestApp;
let base: string;
let admin: string;
let dir: string;
let agent: Agent | undefined;
let created: { token: string; agentCommand: string; agentEnv: { name: string; value: string }[] };

const db = () => t.app.db.prisma;
const gql = async (query: string, variables: Record<string, unknown> = {}) => {
  const r = await t.gql(query, variables, { token: admin });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data as Record<string, any>;
};
async function until<T>(what: string, check: () => Promise<T | undefined | null | false>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
/** The card's replicas, as the console asks for them. */
const card = async (name: string) =>
  (
    await gql(
      `{ model(name: "${name}") { mode awakeUntil replicas { id state desired gpuIndex message node { name } } } }`,
    )
  ).model as {
    mode: string;
    awakeUntil: string | null;
    replicas: { id: string; state: string; desired: string; gpuIndex: number | null; message: string | null }[];
  };
const setMode = (name: string, mode: string, replicas?: number) =>
  gql(
    `mutation { setModelMode(name: "${name}", mode: ${mode}${replicas ? `, replicas: ${replicas}` : ''}) { __typename ... on Error { message } } }`,
  );
/** Runs placement and the agent until the card shows `n` READY replicas and nothing else. */
const settled = (name: string, n: number) =>
  until(`${name} with ${n} ready replica(s) alone`, async () => {
    await t.app.services.fleet.place();
    await agent?.runner.poll();
    const c = await card(name);
    return c.replicas.length === n && c.replicas.every((r) => r.state === 'READY' && r.desired === 'RUN') ? c : null;
  });

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  admin = await t.token('ADMIN', 'fleet-admin');
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-fleet-agent-'));
  const body = tinyLlama();
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': createHash('sha256').update(body).digest('hex') },
    body: new Uint8Array(body),
  });
  expect(put.status).toBe(201);
  created = (
    await gql(
      'mutation { createNode(name: "two-gpu") { ... on CreatedNode { token agentCommand agentEnv { name value } } } }',
    )
  ).createNode;
  agent = createAgent(
    loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: created.token,
      HANGAR_AGENT_DIR: dir,
      HANGAR_AGENT_GPUS: JSON.stringify([
        { index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 },
        { index: 1, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 },
      ]),
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_AGENT_HEARTBEAT_MS: '1000',
      HANGAR_LOG_LEVEL: 'silent',
    }),
    { log: createLogger('silent') },
  );
  await agent.start();
});
afterAll(async () => {
  await agent?.stop();
  await t.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('a fleet that can be changed, with a real agent', () => {
  it('gives the admin the exact command that starts the new node’s agent', () => {
    expect(created.agentEnv).toEqual([
      { name: 'HANGAR_URL', value: base },
      { name: 'HANGAR_NODE_TOKEN', value: created.token },
    ]);
    expect(created.agentCommand).toBe(
      `HANGAR_URL=${base} HANGAR_NODE_TOKEN=${created.token} node packages/agent/bin/hangar-agent.mjs`,
    );
  });

  it('places a replica on each of the node’s two GPUs, and the agent starts each on its own', async () => {
    const served = await gql(
      'mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "tiny", context: 512, mode: ALWAYS, replicas: 2) { __typename ... on Error { message } } }',
    );
    expect(served.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
    const c = await settled('tiny', 2);
    expect(c.replicas.map((r) => r.gpuIndex).sort()).toEqual([0, 1]);
    for (const r of c.replicas) expect(r.message).toContain(`placed on GPU ${r.gpuIndex}`);
    const assigned = await t.gql('{ nodeAssignments { gpuIndex } }', {}, { token: created.token });
    expect(assigned.data?.nodeAssignments.map((a: { gpuIndex: number }) => a.gpuIndex).sort()).toEqual([0, 1]);
  });

  it('shows the replicas as they stand through 2 → 1, on demand, wake, stopped and always again', async () => {
    const before = await card('tiny');
    await setMode('tiny', 'ALWAYS', 1);
    const one = await settled('tiny', 1);
    const id = one.replicas[0]?.id;
    // The older replica stays; the one stopped is gone from the card (its row is kept a while for placement).
    expect(id).toBe(before.replicas[0]?.id);
    expect(await db().replica.count({ where: { model: { name: 'tiny' }, state: 'STOPPED' } })).toBe(1);

    // On demand while it serves: awake its idle time from now, the same replica serving on.
    await setMode('tiny', 'ON_DEMAND');
    await t.app.services.fleet.place();
    await agent?.runner.poll();
    const onDemand = await card('tiny');
    expect(onDemand.awakeUntil).not.toBeNull();
    expect(onDemand.replicas).toMatchObject([{ id, state: 'READY', desired: 'RUN' }]);

    // Woken with a READY replica: the timer moves on, nothing restarts.
    const woken = await gql('mutation { wakeModel(name: "tiny") { ... on Model { awakeUntil } } }');
    expect(new Date(woken.wakeModel.awakeUntil).getTime()).toBeGreaterThanOrEqual(
      new Date(onDemand.awakeUntil as string).getTime(),
    );
    await t.app.services.fleet.place();
    await agent?.runner.poll();
    expect((await card('tiny')).replicas).toMatchObject([{ id, state: 'READY', desired: 'RUN' }]);
    expect(await db().replica.count({ where: { model: { name: 'tiny' } } })).toBe(2);

    // Stopped: nothing on the card, and no timer next to "stopped".
    await setMode('tiny', 'STOPPED');
    const stopped = await until('tiny stopped', async () => {
      await t.app.services.fleet.place();
      await agent?.runner.poll();
      const c = await card('tiny');
      return c.replicas.length === 0 ? c : null;
    });
    expect(stopped).toMatchObject({ mode: 'STOPPED', awakeUntil: null });

    // Always again: one READY chip, none of the stopped ones beside it.
    await setMode('tiny', 'ALWAYS', 1);
    const again = await settled('tiny', 1);
    expect(again.replicas).toHaveLength(1);
    expect(await db().replica.count({ where: { model: { name: 'tiny' }, state: 'STOPPED' } })).toBe(2);
  });

  it('shows the node offline at once when its agent stops, and places its replicas elsewhere', async () => {
    const nodes = async () => (await gql('{ nodes { name online leftAt } }')).nodes;
    expect(await nodes()).toMatchObject([{ name: 'two-gpu', online: true, leftAt: null }]);
    const serving = (await card('tiny')).replicas[0];
    expect(serving).toBeTruthy();
    // A placement pass under way holds the node's leaving off until it has ended: it would see half of it (the
    // node still online, its replicas already lost) and place their replacement on the node that is leaving.
    let release: () => void = () => {};
    let locked: () => void = () => {};
    const holding = new Promise<void>((r) => {
      locked = r;
    });
    const pass = db().$transaction(async (tx) => {
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      locked();
      await new Promise<void>((r) => {
        release = r;
      });
    });
    await holding;
    const stopping = agent?.stop();
    await new Promise((r) => setTimeout(r, 300));
    expect(await nodes()).toMatchObject([{ name: 'two-gpu', online: true, leftAt: null }]);
    release();
    await pass;
    await stopping;
    agent = undefined;
    // No wait for the 30 s without heartbeats: the agent said it was leaving.
    expect(await nodes()).toMatchObject([{ name: 'two-gpu', online: false, leftAt: expect.any(String) }]);
    const row = await db().replica.findUniqueOrThrow({ where: { id: serving?.id } });
    expect(row.state).not.toBe('READY');
    const left = await db().auditEvent.findFirst({ where: { action: 'leaveNode' }, orderBy: { id: 'desc' } });
    expect(left).toMatchObject({ actor: 'node:two-gpu', target: 'two-gpu', outcome: 'DONE' });
    // With no other node, the replacement waits and says why.
    await t.app.services.fleet.place();
    expect((await card('tiny')).replicas).toMatchObject([{ state: 'PENDING', message: 'no node is online' }]);
  });
});
