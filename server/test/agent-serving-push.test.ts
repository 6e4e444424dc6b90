import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import { sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startUpgradeGate, type UpgradeGate } from './fixtures/upgrade-gate.js';
import { startTestApp, type TestApp } from './harness.js';

// The agent's serving work is pushed over its one WebSocket to the control plane (the one its training work
// comes on), not polled: the real agent with llama.cpp on CPU against the real server, through a real proxy
// (fixtures/upgrade-gate.ts) that can refuse the WebSocket or cut the network. The poll interval is set to
// 60 s where the push is what is tested, and every such test gives up long before that: only the push can make
// it pass. Where the channel is refused, polling (every 200 ms here) still delivers the work.

const POLL_NEVER = '60000';

let t: TestApp;
let base: string;
let nodeToken: string;
let operator: string;
let dir: string;
let gate: UpgradeGate;
let agent: Agent | undefined;
let lines: string[] = [];

beforeAll(async () => {
  // The server's public URL is the gate's, as it is a proxy's: the mirror URLs it hands the node lead there too.
  gate = await startUpgradeGate();
  t = await startTestApp({ HANGAR_PUBLIC_URL: gate.url });
  base = await t.app.start();
  gate.forwardTo(base);
  const admin = await t.token('ADMIN', 'push-admin');
  operator = await t.token('OPERATOR', 'push-ops');
  const created = await t.gql(
    'mutation { createNode(name: "push-1") { ... on CreatedNode { token } } }',
    {},
    { token: admin },
  );
  nodeToken = created.data?.createNode.token;
  const tiny = tinyLlama();
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(tiny) },
    body: new Uint8Array(tiny),
  });
  expect(put.status).toBe(201);
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-push-'));
});
afterEach(async () => {
  await agent?.stop();
  agent = undefined;
  gate.mend();
  gate.passUpgrades();
});
afterAll(async () => {
  await gate?.close();
  await t?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

async function startAgent(name: string, pollMs: string) {
  lines = [];
  const config = loadAgentConfig({
    HANGAR_URL: gate.url,
    HANGAR_NODE_TOKEN: nodeToken,
    HANGAR_AGENT_DIR: path.join(dir, name),
    HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
    HANGAR_AGENT_THREADS: '1',
    HANGAR_AGENT_POLL_MS: pollMs,
  });
  agent = createAgent(config, { log: createLogger('info', (l) => lines.push(l)) });
  await agent.start();
  return agent;
}

const logged = (what: string) => lines.some((l) => l.includes(what));
const PUSHED = 'the control plane pushes this node’s assignments';

async function serve(name: string) {
  const served = await t.gql(
    `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "${name}") { __typename ... on Error { message } } }`,
    {},
    { token: operator },
  );
  expect(served.data?.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
  // The server's own placement pass (it runs on its own too): the agent is not asked anything here.
  await t.app.services.fleet.place();
}

const replica = async (name: string) =>
  (await t.app.db.prisma.replica.findFirst({ where: { model: { name } }, orderBy: { createdAt: 'desc' } })) ?? null;

/** Waits (test side) until `check` holds; the test's own timeout is what fails it first. */
async function until(what: string, check: () => Promise<boolean> | boolean, ms = 30_000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(100);
  }
}

/** Waits until the model's newest replica is in `state`. */
const reaches = async (name: string, state: string) => {
  try {
    await until(`${name} ${state}`, async () => (await replica(name))?.state === state);
  } catch (err) {
    const r = await replica(name);
    throw new Error(
      `${(err as Error).message}: the replica is ${r?.state ?? 'not placed'} (${r?.message}); the agent said:\n${lines.slice(-15).join('\n')}`,
    );
  }
};

const setMode = (name: string, mode: string) =>
  t.gql(
    `mutation { setModelMode(name: "${name}", mode: ${mode}) { __typename ... on Error { message } } }`,
    {},
    {
      token: operator,
    },
  );

describe('serving work pushed over the agent’s channel', () => {
  it('runs a replica placed on the node at once, with polls 60 s apart', async () => {
    await startAgent('pushed', POLL_NEVER);
    // Subscribed: the first list (empty) came over the channel.
    await until('the first pushed list', () => logged(PUSHED));
    await serve('push-tiny');
    await reaches('push-tiny', 'READY');
    // One socket for the replicas' and the training jobs' work together.
    expect(gate.passedUpgrades).toBe(1);
    // Stopped the same way: pushed, stopped by the agent, reported.
    expect((await setMode('push-tiny', 'STOPPED')).data?.setModelMode).toEqual({ __typename: 'Model' });
    await reaches('push-tiny', 'STOPPED');
  }, 35_000);

  it('falls back to polling while the channel is refused, and still runs the replica', async () => {
    gate.refuseUpgrades();
    await startAgent('polled', '200');
    await serve('poll-tiny');
    await reaches('poll-tiny', 'READY');
    expect(gate.refusedUpgrades).toBeGreaterThan(0);
    expect(logged(PUSHED)).toBe(false);
    expect((await setMode('poll-tiny', 'STOPPED')).data?.setModelMode).toEqual({ __typename: 'Model' });
    await reaches('poll-tiny', 'STOPPED');
  }, 35_000);

  it('applies a change made while the channel was down once it is back, from the whole list', async () => {
    await startAgent('reconnect', POLL_NEVER);
    await until('the first pushed list', () => logged(PUSHED));
    await serve('back-tiny');
    await reaches('back-tiny', 'READY');
    // The network goes; the model is stopped meanwhile: nothing can tell the agent now.
    gate.cut();
    await until('the channel lost', () => logged('the work channel to the control plane is not connected'));
    expect((await setMode('back-tiny', 'STOPPED')).data?.setModelMode).toEqual({ __typename: 'Model' });
    expect((await replica('back-tiny'))?.state).toBe('READY');
    gate.mend();
    // Reconnected (backoff of at most 10 s), the subscription's first list says STOP.
    await reaches('back-tiny', 'STOPPED');
    expect(logged('the work channel to the control plane is connected again')).toBe(true);
  }, 45_000);
});
