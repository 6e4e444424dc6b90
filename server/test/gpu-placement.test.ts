import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LoopHealth } from '../src/db/outage.js';
import { FleetPlacement } from '../src/fleet/fleet-placement.js';
import { startTestApp, type TestApp } from './harness.js';

// Placement by memory, not by card, with real node agents on loopback running the real llama.cpp (its CPU build)
// on the tiny llama. The GPUs are declared (HANGAR_AGENT_GPUS): this machine has none, and the agents report the
// declared cards as they would report nvidia-smi's. The model's planned memory is set to what a larger model's
// plan would say (8 GiB, 30 GiB): the tiny llama's own plan is a few MiB, and the placement judges the plan.

const GiB = 1024 ** 3;
let t: TestApp;
let base: string;
let admin: string;
let dir: string;
const agents: Agent[] = [];

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
type Card = { index: number; name: string; totalBytes: number; heldBytes: number; measured: boolean };
type Row = {
  id: string;
  state: string;
  message: string | null;
  gpuIndex: number | null;
  gpus: number[];
  memoryBytes: number | null;
  memoryMeasured: boolean;
  cards: Card[];
  node: { name: string } | null;
};
const replicasOf = async (name: string) =>
  (
    await gql(
      `{ model(name: "${name}") { replicas { id state message gpuIndex gpus memoryBytes memoryMeasured cards { index name totalBytes heldBytes measured } node { name } } } }`,
    )
  ).model.replicas as Row[];
const setMode = (name: string, mode: string, replicas?: number) =>
  gql(
    `mutation { setModelMode(name: "${name}", mode: ${mode}${replicas ? `, replicas: ${replicas}` : ''}) { __typename ... on Error { message } } }`,
  );
/** Runs placement and the agents until `done` holds of the model's replicas. */
const settle = (name: string, what: string, done: (rows: Row[]) => boolean) =>
  until(what, async () => {
    await t.app.services.fleet.place();
    for (const a of agents) await a.runner.poll();
    const rows = await replicasOf(name);
    return done(rows) ? rows : null;
  });

async function startAgent(name: string, gpus: number) {
  const created = (await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`)).createNode;
  const agent = createAgent(
    loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: created.token,
      HANGAR_AGENT_DIR: path.join(dir, name),
      // Idle 24 GiB cards, as nvidia-smi reports them: all of each free.
      HANGAR_AGENT_GPUS: JSON.stringify(
        Array.from({ length: gpus }, (_, index) => ({ index, name: 'RTX 4090', totalMiB: 24_576, freeMiB: 24_576 })),
      ),
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_AGENT_HEARTBEAT_MS: '1000',
      HANGAR_LOG_LEVEL: 'silent',
    }),
    { log: createLogger('silent') },
  );
  await fs.mkdir(path.join(dir, name), { recursive: true });
  await agent.start();
  agents.push(agent);
  return { agent, token: created.token as string };
}

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  admin = await t.token('ADMIN', 'gpu-placement');
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-gpu-placement-'));
  const body = tinyLlama();
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': createHash('sha256').update(body).digest('hex') },
    body: new Uint8Array(body),
  });
  expect(put.status).toBe(201);
  // On demand and asleep: nothing is placed until the plan says what a larger model would need.
  const served = await gql(
    'mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "tiny", context: 512, mode: ON_DEMAND) { __typename ... on Error { message } } }',
  );
  expect(served.serveMirrorVersion.__typename).toBe('ServePlaced');
});
afterAll(async () => {
  for (const a of agents.splice(0)) await a.stop();
  await t.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('placement by memory, with real agents and declared GPUs', () => {
  it('puts two 8 GiB replicas on one 24 GiB card, and the third waits saying why, also with passes at once', async () => {
    const { token } = await startAgent('one-card', 1);
    await db().catalogModel.update({ where: { name: 'tiny' }, data: { memoryBytes: BigInt(8 * GiB) } });
    await setMode('tiny', 'ALWAYS', 3);
    // Three passes at once, two of them as a second server would run them: one places at a time, so the card is
    // booked once, not three times over.
    const other = () => new FleetPlacement({ db: db(), health: new LoopHealth('placement', undefined) });
    await Promise.all([t.app.services.fleet.place(), other().place(), other().place()]);
    expect(await db().replica.count({ where: { model: { name: 'tiny' } } })).toBe(3);

    const rows = await settle(
      'tiny',
      'two READY on GPU 0 and one waiting',
      (rs) => rs.filter((r) => r.state === 'READY').length === 2 && rs.length === 3,
    );
    const ready = rows.filter((r) => r.state === 'READY');
    for (const r of ready) {
      expect(r).toMatchObject({ gpuIndex: 0, gpus: [0], node: { name: 'one-card' }, memoryBytes: 8 * GiB });
      // llama.cpp's CPU build puts no layer on a GPU: the plan stays what the replica is booked at.
      expect(r.memoryMeasured).toBe(false);
      expect(r.cards).toEqual([
        { index: 0, name: 'RTX 4090', totalBytes: 24 * GiB, heldBytes: 8 * GiB, measured: false },
      ]);
      expect(r.message).toContain('placed on GPU 0');
    }
    const waiting = rows.find((r) => r.state === 'PENDING');
    expect(waiting).toMatchObject({ node: null, gpus: [], cards: [] });
    expect(waiting?.message).toBe(
      'fits on no node: needs 8.0 GiB, the most room is 5.6 GiB on one-card GPU 0 (of 24.0 GiB: 16.0 GiB held by 2 replicas, 2.4 GiB kept free by HANGAR_GPU_MEMORY_MARGIN). It is placed once a card (or the cards of one node together) has that room: when a replica there stops, a node with more GPU memory joins, or HANGAR_GPU_MEMORY_MARGIN is lowered',
    );
    // The agent was given both, on the same card.
    const assigned = await t.gql('{ nodeAssignments { gpuIndex gpuIndexes gpuMemoryFraction } }', {}, { token });
    expect(assigned.data?.nodeAssignments).toEqual([
      // A third of the card each (8 of 24 GiB): what vLLM would be told it may take, rather than its 90 %.
      { gpuIndex: 0, gpuIndexes: [], gpuMemoryFraction: 0.34 },
      { gpuIndex: 0, gpuIndexes: [], gpuMemoryFraction: 0.34 },
    ]);
  });

  it('splits a model larger than one card over two cards of one node, and the agent runs it on both', async () => {
    await setMode('tiny', 'STOPPED');
    await settle('tiny', 'tiny stopped', (rs) => rs.length === 0);
    await db().catalogModel.update({ where: { name: 'tiny' }, data: { memoryBytes: BigInt(30 * GiB) } });
    await setMode('tiny', 'ALWAYS', 1);
    // Only the one-card node is up: 30 GiB fits on none of its cards, and no split crosses nodes.
    await t.app.services.fleet.place();
    const alone = await replicasOf('tiny');
    expect(alone).toMatchObject([{ state: 'PENDING', node: null }]);
    expect(alone[0]?.message).toMatch(
      /^fits on no node: needs 30\.0 GiB, the most room is 21\.6 GiB on one-card GPU 0/,
    );

    const { token } = await startAgent('two-card', 2);
    const [split] = await settle('tiny', 'tiny READY split over two cards', (rs) =>
      rs.some((r) => r.state === 'READY'),
    );
    expect(split).toMatchObject({
      node: { name: 'two-card' },
      gpuIndex: null,
      gpus: [0, 1],
      memoryBytes: 30 * GiB,
      cards: [
        { index: 0, totalBytes: 24 * GiB, heldBytes: 15 * GiB },
        { index: 1, totalBytes: 24 * GiB, heldBytes: 15 * GiB },
      ],
    });
    expect(split?.message).toContain('placed split across GPUs 0,1');
    const assigned = await t.gql('{ nodeAssignments { gpuIndex gpuIndexes gpuMemoryFraction } }', {}, { token });
    expect(assigned.data?.nodeAssignments).toEqual([{ gpuIndex: null, gpuIndexes: [0, 1], gpuMemoryFraction: 0.63 }]);
  });
});
