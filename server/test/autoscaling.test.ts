import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// Autoscaling and draining end to end: real node agents on loopback run a model's replicas as child processes the
// way they run llama-server, here the stand-in engine (packages/agent/test/fixtures/stand-in-engine.mjs: llama-server
// cannot be built here, and llama.cpp in-process finishes the tiny llama's answers before a test can stop anything
// under them); it streams each answer a word every 150 ms and ends its connections when stopped (SIGTERM), as
// llama-server does, so a replica stopped under a stream would cut it. Applications call through the gateway with
// the official `openai` client, several streams at once. The window is a second (HANGAR_SCALE_WINDOW_SECONDS).

const STAND_IN = fileURLToPath(new URL('../../packages/agent/test/fixtures/stand-in-engine.mjs', import.meta.url));

let t: TestApp;
let base: string;
let admin: string;
let app: string;
let dir: string;
const agents = new Map<string, Agent>();

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
    if (Date.now() > deadline)
      throw new Error(`${what}: not within ${ms} ms; the card: ${JSON.stringify(await card().catch(() => null))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A node with four declared GPUs and its agent, running llama.cpp replicas through the stand-in llama-server. */
async function startNode(name: string): Promise<Agent> {
  const created = (await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`)).createNode;
  const agent = createAgent(
    loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: created.token,
      HANGAR_AGENT_DIR: path.join(dir, name),
      HANGAR_AGENT_GPUS: JSON.stringify(
        [0, 1, 2, 3].map((index) => ({ index, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 })),
      ),
      HANGAR_AGENT_LLAMA_SERVER: `${process.execPath} ${STAND_IN} --stand-in-stream-ms 150`,
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_AGENT_HEARTBEAT_MS: '1000',
      HANGAR_LOG_LEVEL: 'silent',
    }),
    { log: createLogger('silent') },
  );
  await agent.start();
  agents.set(name, agent);
  return agent;
}

type Card = {
  replicas: { id: string; state: string; desired: string; drainingSince: string | null; node: { name: string } }[];
  scalingDecisions: { at: string; message: string }[];
};
const card = async (): Promise<Card> =>
  (
    await gql(
      '{ model(name: "tiny") { replicas { id state desired drainingSince node { name } } scalingDecisions { at message } } }',
    )
  ).model;
/** Serving replicas that take requests. */
const serving = (c: Card) => c.replicas.filter((r) => r.state === 'READY' && r.desired === 'RUN' && !r.drainingSince);

/**
 * Callers that each stream one chat after another until told to stop, counting the answers that came whole and
 * every failure (a cut stream, an error answer): the thing a scale-down must never cause.
 */
function callers(n: number) {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: app, maxRetries: 0 });
  const state = { whole: 0, failures: [] as string[], stop: false, seen: new Set<string>() };
  let count = 0;
  const one = async () => {
    while (!state.stop) {
      try {
        const { data: stream, response } = await client.chat.completions
          .create({
            model: 'tiny',
            messages: [{ role: 'user', content: `question ${++count}` }],
            stream: true,
          })
          .withResponse();
        state.seen.add(response.headers.get('x-hangar-replica') ?? '');
        let text = '';
        let finished = false;
        for await (const chunk of stream) {
          text += chunk.choices[0]?.delta?.content ?? '';
          if (chunk.choices[0]?.finish_reason === 'stop') finished = true;
        }
        if (finished && text.endsWith(' word9')) state.whole++;
        else state.failures.push(`cut: "${text}"`);
      } catch (err) {
        state.failures.push((err as Error).message);
      }
    }
  };
  const running = Array.from({ length: n }, one);
  return {
    state,
    /** Lets each caller finish the stream it has open, then stop. */
    stop: async () => {
      state.stop = true;
      await Promise.all(running);
      return state;
    },
  };
}

beforeAll(async () => {
  t = await startTestApp({
    HANGAR_SCALE_WINDOW_SECONDS: '1',
    HANGAR_DRAIN_GRACE_SECONDS: '60',
    HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '1000',
  });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'scaling-admin');
  app = await t.token('VIEWER', 'an-application');
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-autoscaling-'));
  const body = tinyLlama();
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': createHash('sha256').update(body).digest('hex') },
    body: new Uint8Array(body),
  });
  expect(put.status).toBe(201);
  await startNode('node-a');
  const served = await gql(
    'mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "tiny", context: 512, mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }',
  );
  expect(served.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
  // Least loaded: every replica gets streams, so the one removed holds some when it is chosen.
  await gql('mutation { setModelRouting(name: "tiny", policy: LEAST_LOADED) { __typename } }');
  await until('one ready replica', async () => serving(await card()).length === 1);
});

afterAll(async () => {
  await Promise.all([...agents.values()].map((a) => a.stop()));
  await t?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('autoscaling on load, with draining', () => {
  it('refuses bounds and targets that make no sense, naming the field', async () => {
    const r = await t.gql(
      'mutation { setModelScaling(name: "tiny", minReplicas: 3, maxReplicas: 2, targetInFlight: 0) { __typename ... on ValidationError { field message } } }',
      {},
      { token: admin },
    );
    expect(r.data?.setModelScaling).toMatchObject({ __typename: 'ValidationError' });
    expect(['maxReplicas', 'targetInFlight']).toContain(r.data?.setModelScaling.field);
    const refused = await db().auditEvent.findFirst({ where: { action: 'setModelScaling' } });
    expect(refused).toMatchObject({ outcome: 'REFUSED' });
    expect(await db().catalogModel.findUniqueOrThrow({ where: { name: 'tiny' } })).toMatchObject({
      minReplicas: 1,
      maxReplicas: 1,
      targetInFlight: null,
    });
  });

  it('adds replicas under concurrent streams and drains them away after, with no request failed', {
    timeout: 120_000,
  }, async () => {
    const set = await gql(
      'mutation { setModelScaling(name: "tiny", minReplicas: 1, maxReplicas: 3, targetInFlight: 2) { __typename ... on Model { minReplicas maxReplicas targetInFlight } } }',
    );
    expect(set.setModelScaling).toEqual({ __typename: 'Model', minReplicas: 1, maxReplicas: 3, targetInFlight: 2 });
    // Eight streams at once on one replica: 8 in flight per replica against a target of 2.
    const busy = callers(8);
    const up = await until('three ready replicas', async () => {
      const c = await card();
      return serving(c).length === 3 ? c : null;
    });
    expect(
      up.scalingDecisions.map((d) => d.message.replace(/^[\d.]+ in flight per replica for [\d.]+ s/, '…')),
    ).toEqual(['…, target 2: 2 → 3', '…, target 2: 1 → 2']);
    // Two streams go on while the load per replica falls to under the target: 3 → 2 → 1, each removed replica
    // drained (no new requests, those it has finished) before its engine is stopped.
    const few = callers(2);
    const busyDone = await busy.stop();
    const down = await until('one ready replica and no other left running', async () => {
      const c = await card();
      return serving(c).length === 1 && c.replicas.length === 1 ? c : null;
    });
    const fewDone = await few.stop();
    expect(busyDone.failures).toEqual([]);
    expect(fewDone.failures).toEqual([]);
    expect(busyDone.whole + fewDone.whole).toBeGreaterThan(10);
    // Streams went to the replicas that were later removed: their drain is what kept them whole.
    expect(busyDone.seen.size).toBeGreaterThanOrEqual(2);
    expect(
      down.scalingDecisions.map((d) => d.message.replace(/^[\d.]+ in flight per replica for [\d.]+ s/, '…')),
    ).toEqual(['…, target 2: 2 → 1', '…, target 2: 3 → 2', '…, target 2: 2 → 3', '…, target 2: 1 → 2']);
    for (const d of down.scalingDecisions)
      expect(d.message).toMatch(/^\d+(\.\d)? in flight per replica for \d+(\.\d)? s, target 2: /);
    const audited = await db().auditEvent.findMany({ where: { action: 'scaleModel' }, orderBy: { id: 'asc' } });
    expect(audited.map((a) => [a.actor, a.target, a.outcome])).toEqual(
      Array(4).fill(['system:autoscaler', 'tiny', 'DONE']),
    );
    // Every removed replica was drained before it was stopped.
    const stopped = await db().replica.findMany({ where: { state: 'STOPPED' } });
    expect(stopped).toHaveLength(2);
    for (const r of stopped) expect(r.drainingSince).not.toBeNull();
    const metrics = await (await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${admin}` } })).text();
    expect(metrics).toContain('hangar_scaling_decisions_total{model="tiny",direction="up"} 2');
    expect(metrics).toContain('hangar_scaling_decisions_total{model="tiny",direction="down"} 2');
  });

  it('drains a node that leaves: its streams finish, and another node takes its place', {
    timeout: 60_000,
  }, async () => {
    const before = serving(await card());
    expect(before).toMatchObject([{ node: { name: 'node-a' } }]);
    await startNode('node-b');
    const load = callers(2);
    // Streams open on node-a's replica before its agent is told to stop (SIGTERM does agent.stop()).
    await until('streams on node-a', async () => load.state.seen.has(before[0]?.id ?? ''));
    await new Promise((r) => setTimeout(r, 300));
    const leaving = agents.get('node-a')?.stop();
    agents.delete('node-a');
    const row = await until('node-a draining', async () => {
      const r = await db().replica.findUniqueOrThrow({ where: { id: before[0]?.id } });
      return r.drainingSince ? r : null;
    });
    expect(row.message).toContain('node node-a is shutting down');
    await until('a ready replica on node-b', async () => serving(await card()).some((r) => r.node.name === 'node-b'));
    await leaving;
    const done = await load.stop();
    expect(done.failures).toEqual([]);
    expect(done.whole).toBeGreaterThan(0);
    expect(await db().replica.findUniqueOrThrow({ where: { id: before[0]?.id } })).toMatchObject({
      state: 'STOPPED',
      desired: 'STOP',
    });
    const left = await db().auditEvent.findFirst({ where: { action: 'leaveNode' }, orderBy: { id: 'desc' } });
    expect(left?.message).toContain('1 replica draining');
  });
});
