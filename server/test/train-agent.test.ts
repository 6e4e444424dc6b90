import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { freePort } from '@hangar/common/free-port';
import { createLogger } from '@hangar/common/log';
import { createClient } from 'graphql-ws';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// A training job end to end through a real node agent and the stand-in trainer (fixtures/stand-in-trainer.mjs,
// the same protocol as packages/agent/trainer/train_lora.py, which needs a GPU): progress arriving over a subscription,
// a cancel mid-run, an agent killed mid-run, and the server restarted mid-run.

const TRAINER = new URL('./fixtures/stand-in-trainer.mjs', import.meta.url).pathname;
// The agent's own package, where `hangar-agent` runs it from (as an operator's checkout does).
const AGENT_ROOT = new URL('../../packages/agent/', import.meta.url).pathname;

let t: TestApp;
let hub: FakeHub;
let base: string;
let w: TrainingWorld;
let port: number;
const agents: Agent[] = [];
const children: ChildProcess[] = [];
let dirs: string[] = [];

const pairs = (n: number) => Array.from({ length: n }, (_, i) => JSON.stringify({ q: `q${i}`, a: `a${i}` })).join('\n');

beforeAll(async () => {
  hub = await startFakeHub();
  port = await freePort();
  // A fixed port, so the agent finds the server again after it restarts.
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_TRAIN_LOST_SECONDS: '5', PORT: String(port) });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
});
afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill('SIGKILL');
  await Promise.all(agents.splice(0).map((a) => a.stop()));
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
  dirs = [];
  await t.app.db.prisma.trainJob.updateMany({
    where: { state: { in: ['QUEUED', 'RUNNING'] } },
    data: { state: 'CANCELLED' },
  });
});
afterAll(async () => {
  await t.close();
  await hub.close();
});

async function agentEnv(stepMs: number) {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-agent-'));
  dirs.push(dir);
  return {
    HANGAR_URL: base,
    HANGAR_NODE_TOKEN: w.nodeToken,
    HANGAR_AGENT_DIR: dir,
    HANGAR_AGENT_GPUS: JSON.stringify([{ name: 'H100', totalMiB: 81559, freeMiB: 20000 }]),
    HANGAR_AGENT_HEARTBEAT_MS: '500',
    HANGAR_TRAINER: `${process.execPath} ${TRAINER}`,
    HANGAR_TRAINER_GRACE_MS: '2000',
    HANGAR_STAND_IN_STEP_MS: String(stepMs),
    // A job that ends DONE is then evaluated against its base with llama.cpp on the CPU (train-evaluate.ts): one
    // thread, as llama.cpp's spinning threads crawl when they outnumber this machine's two cores.
    HANGAR_AGENT_THREADS: '1',
    HANGAR_LOG_LEVEL: 'silent',
  };
}

/** An agent in this process (llama.cpp is not started: these jobs train, they do not serve). */
async function startAgent(stepMs: number) {
  const env = await agentEnv(stepMs);
  process.env.HANGAR_STAND_IN_STEP_MS = env.HANGAR_STAND_IN_STEP_MS;
  const agent = createAgent(loadAgentConfig(env), {
    log: createLogger('silent'),
    runtime: () => Promise.reject(new Error('llama.cpp is not needed to train')),
  });
  agents.push(agent);
  await agent.start();
  return agent;
}

async function submit(n = 12, params: Record<string, number> = { batch: 1, epochs: 1, rank: 4 }) {
  const r = await t.gql(
    `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
    {
      i: {
        name: `job-${Math.random().toString(36).slice(2, 8)}`,
        model: 'tiny',
        baseRepo: BASE_REPO,
        node: 'gpu-1',
        gpuMiB: 4000,
        public: true,
        data: pairs(n),
        // None held out: these tests count steps against the pairs given (train-eval.test.ts holds some out).
        evalShare: 0,
        params,
      },
    },
    { token: w.operator },
  );
  expect(r.data?.createTrainJob.__typename, JSON.stringify(r)).toBe('TrainJob');
  return r.data?.createTrainJob.id as string;
}

const job = (id: string) => t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });

// Long enough for a job that ends DONE to be evaluated after training (base and adapter answer the general questions).
async function until<T>(check: () => Promise<T | undefined | false>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('a job through a real agent and the stand-in trainer', () => {
  it('trains, streams its progress to a subscriber as it goes, and ends DONE with the adapter and its GGUF', async () => {
    const seen: { state: string; step: number; steps: number }[] = [];
    const client = createClient({
      url: `${base.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${w.operator}` },
    });
    const unsubscribe = client.subscribe(
      { query: 'subscription { trainJobChanged { id state step steps } }' },
      { next: (m) => seen.push((m.data as any).trainJobChanged), error: () => {}, complete: () => {} },
    );
    try {
      // Connected, then a moment for the subscription to be set up on the server: on two busy cores a fixed
      // 200 ms was sometimes not enough, and the first steps went by unheard.
      await new Promise<void>((r) => client.on('connected', () => r()));
      await new Promise((r) => setTimeout(r, 300));
      await startAgent(100);
      const id = await submit(12);
      const done = await until(async () => ((await job(id)).state === 'DONE' ? job(id) : undefined));
      expect(done).toMatchObject({ step: 12, steps: 12, message: 'trained' });
      const steps = seen.filter((s) => s.state === 'RUNNING').map((s) => s.step);
      // Live: several distinct steps arrived while it ran, in order, not just the final state.
      expect(new Set(steps).size).toBeGreaterThanOrEqual(3);
      expect(steps).toEqual([...steps].sort((a, b) => a - b));
      expect(await t.app.db.prisma.trainMetric.count({ where: { jobId: id } })).toBe(12);
      const kinds = (await t.app.db.prisma.trainArtifact.findMany({ where: { jobId: id } })).map((a) => a.kind).sort();
      expect(kinds).toEqual(['gguf', 'peft']);
    } finally {
      unsubscribe();
      await client.dispose();
    }
  }, 90_000);

  it('stops the trainer when the job is cancelled mid-run, and says so once it has exited', async () => {
    const agent = await startAgent(100);
    const id = await submit(200);
    await until(async () => (await job(id)).step >= 3);
    const r = await t.gql(
      `mutation { cancelTrainJob(id: "${id}") { __typename ... on TrainJob { cancelRequested } } }`,
      {},
      { token: w.operator },
    );
    expect(r.data?.cancelTrainJob).toEqual({ __typename: 'TrainJob', cancelRequested: true });
    const ended = await until(async () => ((await job(id)).state === 'CANCELLED' ? job(id) : undefined));
    expect(ended.message).toMatch(/SIGTERM/);
    expect(ended.step).toBeLessThan(200);
    await until(async () => agent.trainer.snapshot() === null, 5000);
  });

  it('fails the job of an agent killed mid-run once its lease runs out, and a new agent runs the next job', async () => {
    const env = await agentEnv(100);
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
      cwd: AGENT_ROOT,
      env: { ...process.env, ...env },
      stdio: 'ignore',
    });
    children.push(child);
    const id = await submit(200);
    await until(async () => (await job(id)).step >= 2, 60_000);
    child.kill('SIGKILL');
    const failed = await until(async () => ((await job(id)).state === 'FAILED' ? job(id) : undefined), 20_000);
    expect(failed.message).toMatch(/gpu-1 stopped reporting for 5 s/);
    // A report from the dead agent's trainer, had it got one out, changes nothing now (tested in train.test).
    await startAgent(10);
    const next = await submit(4);
    await until(async () => (await job(next)).state === 'DONE');
  }, 90_000);

  it('keeps training through a server restart and loses no step', async () => {
    await startAgent(100);
    const id = await submit(40);
    await until(async () => (await job(id)).step >= 3);
    await t.restart();
    await t.app.start();
    const done = await until(async () => ((await job(id)).state === 'DONE' ? job(id) : undefined), 40_000);
    expect(done.step).toBe(40);
    const steps = (await t.app.db.prisma.trainMetric.findMany({ where: { jobId: id }, orderBy: { step: 'asc' } })).map(
      (m) => m.step,
    );
    expect(steps).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
  }, 60_000);

  it('ends DONE with its adapter when the control plane was down for longer than the lost time', async () => {
    const agent = await startAgent(100);
    const id = await submit(30);
    await until(async () => (await job(id)).step >= 3);
    await t.app.stop();
    const down = Date.now();
    // The trainer finishes while nobody listens: its last steps, the adapter and the end wait on the node.
    await until(async () => agent.trainer.snapshot()?.phase === 'uploading', 20_000);
    await new Promise((r) => setTimeout(r, Math.max(0, 7000 - (Date.now() - down))));
    expect(Date.now() - down).toBeGreaterThan(5000); // HANGAR_TRAIN_LOST_SECONDS
    await t.restart();
    await t.app.start();
    const done = await until(async () => ((await job(id)).state === 'DONE' ? job(id) : undefined), 30_000);
    expect(done).toMatchObject({ step: 30, steps: 30, message: 'trained' });
    expect(await t.app.db.prisma.trainMetric.count({ where: { jobId: id } })).toBe(30);
    const kinds = (await t.app.db.prisma.trainArtifact.findMany({ where: { jobId: id } })).map((a) => a.kind).sort();
    expect(kinds).toEqual(['gguf', 'peft']);
  }, 90_000);

  it('still fails a job whose node stays silent once the control plane is back, counting from its return', async () => {
    const id = await submit(4);
    // Claimed by hand, by a node that then says nothing: no agent runs here.
    const claim = await t.gql(
      `mutation { claimTrainJob(id: "${id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.nodeToken },
    );
    expect(claim.data?.claimTrainJob.__typename).toBe('TrainClaim');
    await t.restart();
    // Its lease ran out while the control plane was down.
    await t.app.db.prisma.trainJob.update({ where: { id }, data: { leaseUntil: new Date(Date.now() - 60_000) } });
    await t.app.start();
    await t.app.services.train.sweep();
    expect((await job(id)).state).toBe('RUNNING');
    await t.app.services.train.sweep(new Date(Date.now() + 6000));
    const failed = await job(id);
    expect(failed.state).toBe('FAILED');
    expect(failed.message).toMatch(/gpu-1 stopped reporting for 5 s/);
  });
});
