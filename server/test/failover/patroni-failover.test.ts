import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { type Client, createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { createPrisma } from '../../src/db/client.js';
import { createDatabaseIfMissing } from '../../src/db/embedded.js';
import { migrate } from '../../src/db/migrate.js';
import { type FakeHub, startFakeHub } from '../fixtures/fake-hub.js';
import { startReportingNode } from '../fixtures/reporting-node.js';
import { fetchInto, midway, settle, until } from '../fixtures/server-process.js';
import { type StandInReplica, startStandInReplica } from '../fixtures/stand-in-replica.js';
import { BASE_REPO, type TrainingWorld, trainingWorld } from '../fixtures/training.js';
import { startTestApp, type TestApp } from '../harness.js';
import { type PatroniCluster, startPatroniCluster } from './patroni-cluster.js';

// The database fails over under a working control plane. PostgreSQL runs under Patroni (etcd, two members, a
// synchronous standby) behind HAProxy, and Hangar's DATABASE_URL names HAProxy's read-write port, as a site
// that keeps its database highly available runs it. While a file is downloading, an application is chatting
// through the gateway (the official `openai` client) and a real node agent is reporting a training job's steps,
// the leader's machine dies: kill -9 of its Patroni and its PostgreSQL. Hangar must find the new primary by
// itself (its pools and its LISTEN connection), keep every change it was told was committed, fail neither the
// download nor the job, answer /v1 from memory meanwhile, and say on /readyz what it is waiting for.

const run = promisify(execFile);
const ENSURE = new URL('./ensure-patroni.sh', import.meta.url).pathname;
const TRAINER = new URL('../fixtures/stand-in-trainer.mjs', import.meta.url).pathname;
const KEY = 'hgk_failover-engine-key-0123456789abcdef01';
const SIZE = 3 * 1024 * 1024;

let root: string;
let cluster: PatroniCluster | undefined;
let up: Upstream | undefined;
let hub: FakeHub | undefined;
let replica: StandInReplica | undefined;
let stopNode: (() => void) | undefined;
let t: TestApp | undefined;
let agent: Agent | undefined;
let ws: Client | undefined;
let base: string;
let w: TrainingWorld;

beforeAll(async () => {
  // Debian's packages, installed on first use (root or sudo), as the browser tests install Chromium.
  await run('sh', [ENSURE], { timeout: 280_000 });
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  root = path.join(os.tmpdir(), `hangar-failover-${process.pid}-${randomBytes(3).toString('hex')}`);
  await fs.mkdir(root, { recursive: true, mode: 0o755 });
  cluster = await startPatroniCluster(root);
  await createDatabaseIfMissing(cluster.url('postgres'), 'hangar');
  const url = cluster.url('hangar');
  await migrate(url, createLogger('silent'));
  hub = await startFakeHub();
  up = await startUpstream();
  replica = await startStandInReplica({ key: KEY });
  t = await startTestApp(
    { HANGAR_HUB_URL: hub.url },
    {
      database: async () => {
        const prisma = createPrisma(url);
        return { prisma, url, embedded: false, close: () => prisma.$disconnect() };
      },
    },
  );
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
  // A model served by a replica on a node that keeps reporting (the stand-in engine), for the gateway.
  const db = t.app.db.prisma;
  const node = await startReportingNode(db, 'gpu-2');
  stopNode = node.stop;
  const model = await db.catalogModel.create({
    data: { name: 'chatty', source: 'http://mirror.example/mirror/chatty/v1/model.gguf', engine: 'llamacpp' },
  });
  const r = await db.replica.create({
    data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
  });
  await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });
  await t.app.services.gateway.routes.refresh();
}, 300_000);

afterAll(async () => {
  await ws?.dispose();
  await agent?.stop();
  stopNode?.();
  await t?.close();
  await cluster?.stop();
  await replica?.close();
  await up?.close();
  await hub?.close();
  if (root) await fs.rm(root, { recursive: true, force: true });
}, 60_000);

/** A GraphQL operation over HTTP, as a script sends it; `undefined` when it did not get through. */
async function graphql(query: string, variables: Record<string, unknown>, token: string) {
  try {
    const res = await fetch(`${base}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ query, variables }),
      signal: AbortSignal.timeout(15_000),
    });
    return (await res.json()) as { data?: Record<string, any>; errors?: unknown[] };
  } catch {
    return undefined;
  }
}

const MAKE_TOKEN = `mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on CreatedApiToken { secret } ... on Error { message } } }`;

describe('a Patroni failover under a working control plane', () => {
  it('reconnects to the new primary by itself, keeps every committed change, and fails no download, request or job', async () => {
    if (!cluster || !t || !up) throw new Error('not set up');
    const db = t.app.db.prisma;
    const openai = new OpenAI({
      baseURL: `${base}/v1`,
      apiKey: await t.token('VIEWER', 'an-application'),
      maxRetries: 0,
    });
    const chat = async () => {
      const answer = await openai.chat.completions.create({
        model: 'chatty',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      let text = '';
      for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
      return text;
    };
    const expected = replica?.words.join('');
    // Seen before the failover: the gateway knows this caller from memory.
    expect(await chat()).toBe(expected);

    // A watcher of the training job, over graphql-ws.
    const heard: { step: number; at: number }[] = [];
    ws = createClient({
      url: `${base.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${w.operator}` },
    });
    ws.subscribe(
      { query: 'subscription { trainJobChanged { id state step } }' },
      {
        next: (m) => {
          const j = (m.data as { trainJobChanged?: { step: number } } | undefined)?.trainJobChanged;
          if (j) heard.push({ step: j.step, at: performance.now() });
        },
        error: () => {},
        complete: () => {},
      },
    );
    await new Promise<void>((r) => ws?.on('connected', () => r()));

    // A real agent trains a long job with the stand-in trainer, a step every 150 ms.
    process.env.HANGAR_STAND_IN_STEP_MS = '150';
    const agentDir = path.join(root, 'agent');
    await fs.mkdir(agentDir, { recursive: true });
    agent = createAgent(
      loadAgentConfig({
        HANGAR_URL: base,
        HANGAR_NODE_TOKEN: w.nodeToken,
        HANGAR_AGENT_DIR: agentDir,
        HANGAR_AGENT_GPUS: JSON.stringify([{ name: 'H100', totalMiB: 81559, freeMiB: 20000 }]),
        HANGAR_AGENT_HEARTBEAT_MS: '500',
        HANGAR_TRAINER: `${process.execPath} ${TRAINER}`,
        HANGAR_TRAINER_GRACE_MS: '2000',
        HANGAR_STAND_IN_STEP_MS: '150',
        HANGAR_AGENT_THREADS: '1',
        HANGAR_LOG_LEVEL: 'silent',
      }),
      { log: createLogger('silent'), runtime: () => Promise.reject(new Error('llama.cpp is not needed to train')) },
    );
    await agent.start();
    const pairs = Array.from({ length: 600 }, (_, i) => JSON.stringify({ q: `q${i}`, a: `a${i}` })).join('\n');
    const created = await graphql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name: 'through-the-failover',
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 4000,
          public: true,
          data: pairs,
          evalShare: 0,
          params: { batch: 1, epochs: 1, rank: 4 },
        },
      },
      w.operator,
    );
    expect(created?.data?.createTrainJob.__typename, JSON.stringify(created)).toBe('TrainJob');
    const jobId = created?.data?.createTrainJob.id as string;
    const job = () => db.trainJob.findUniqueOrThrow({ where: { id: jobId } });
    await until('the job to be training', async () => ((await job()).step >= 3 ? true : undefined), 60_000);

    // A download, dripping 32 KiB every 100 ms (about 10 s for the file): under way when the leader dies.
    const body = bytes(SIZE, 30);
    up.files.set('failover.gguf', { body, fault: { kind: 'drip', chunk: 32 * 1024, everyMs: 100 } });
    await fetchInto(base, w.operator, 'failover', up.url('failover.gguf'), body);
    await midway(base, w.operator, 'failover', SIZE);

    // Three things keep going, before, through and after the failover: an application's chats, an admin's
    // mutations (API tokens made, each one a committed change to look for afterwards), and a load balancer's
    // /readyz probes.
    let going = true;
    let killedAt = Number.POSITIVE_INFINITY;
    const chats = { answered: 0, answeredBeforeBack: 0, failed: [] as string[] };
    const committed: { name: string; at: number }[] = [];
    const unready = new Set<string>();
    let firstCommitAfterKill: number | undefined;
    let readyAgainAt: number | undefined;
    const chatting = (async () => {
      while (going) {
        const text = await chat().catch((e: unknown) => `failed: ${String(e)}`);
        if (text === expected) {
          chats.answered++;
          if (performance.now() > killedAt && firstCommitAfterKill === undefined) chats.answeredBeforeBack++;
        } else chats.failed.push(text);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const mutating = (async () => {
      for (let i = 0; going; i++) {
        const name = `failover-probe-${i}`;
        const r = await graphql(MAKE_TOKEN, { i: { name, role: 'VIEWER' } }, w.admin);
        if (r?.data?.createApiToken?.__typename === 'CreatedApiToken') {
          const at = performance.now();
          committed.push({ name, at });
          if (at > killedAt) firstCommitAfterKill ??= at;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    const probing = (async () => {
      while (going) {
        try {
          const res = await fetch(`${base}/readyz`, { signal: AbortSignal.timeout(10_000) });
          const answer = (await res.json()) as { reason?: string };
          if (res.status === 503) unready.add(answer.reason ?? '');
          else if (res.status === 200 && performance.now() > killedAt && unready.size > 0)
            readyAgainAt ??= performance.now();
        } catch {
          // /readyz itself must answer; counted below through `unready` staying empty.
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    })();

    try {
      await until(
        'a few committed mutations before the failover',
        async () => (committed.length >= 3 ? true : undefined),
        20_000,
      );
      const leader = await cluster.leader();
      expect(leader, cluster.logs()).toBeDefined();
      const stepAtKill = (await job()).step;
      killedAt = performance.now();
      cluster.killMember(leader as NonNullable<typeof leader>);

      const newLeader = await until(
        'a new primary',
        async () => {
          const l = await cluster?.leader();
          return l && l !== leader ? { member: l, at: performance.now() } : undefined;
        },
        60_000,
      ).catch((err) => {
        throw new Error(`${String(err)}\n${cluster?.logs()}`);
      });
      await until('a committed mutation after the failover', async () => firstCommitAfterKill, 60_000);
      await until('/readyz to answer 200 again', async () => readyAgainAt, 60_000);
      // The job goes on: its steps keep arriving, through the new primary.
      await until(
        'the job to report past the failover',
        async () => ((await job()).step > stepAtKill + 10 ? true : undefined),
        60_000,
      );
      // Live events too: a step reported now is heard by the watcher (LISTEN reconnected on its own).
      const stepNow = (await job()).step;
      await until(
        'the watcher to hear a step after the failover',
        async () => (heard.some((h) => h.step > stepNow) ? true : undefined),
        30_000,
      );
      const done = await settle(base, w.operator, 'failover', 60_000);

      going = false;
      await Promise.all([chatting, mutating, probing]);

      // Every change Hangar said was committed is on the new primary: nothing acknowledged was lost.
      const names = committed.map((c) => c.name);
      const kept = await db.apiToken.findMany({ where: { name: { in: names } }, select: { name: true } });
      expect(kept.map((k) => k.name).sort()).toEqual([...names].sort());
      // The job: still running, and every step it trained is recorded, none lost and none left out: the agent
      // kept the reports that could not get through and sent them once the database answered.
      const running = await job();
      expect(running.state).toBe('RUNNING');
      const steps = (
        await db.trainMetric.findMany({ where: { jobId }, select: { step: true }, orderBy: { step: 'asc' } })
      ).map((m) => m.step);
      expect(steps).toEqual(Array.from({ length: steps.length }, (_, i) => i + 1));
      expect(steps.length).toBeGreaterThanOrEqual(running.step);
      // The download: finished, verified, not failed.
      expect(done).toMatchObject({ state: 'PRESENT', error: null, bytesDone: SIZE, bytesTotal: SIZE });
      expect(done.files).toEqual([{ state: 'PRESENT', sha256: sha256(body), verified: true }]);
      // The gateway answered every request, some of them while the database was away.
      expect(chats.failed).toEqual([]);
      expect(chats.answeredBeforeBack).toBeGreaterThan(0);
      // And /readyz said what it was waiting for meanwhile: the database, and which loops and live events. Not
      // where the database is: /readyz answers anyone (docs/security.md); the details go to the log.
      const said = JSON.stringify([...unready]);
      expect(
        [...unready].some((r) => r.includes('database unreachable')),
        said,
      ).toBe(true);
      expect(
        [...unready].some((r) => r.includes('waiting for the database: mirror downloads')),
        said,
      ).toBe(true);
      expect(
        [...unready].some((r) => r.includes('live events: not connected to the database')),
        said,
      ).toBe(true);
      expect(said).not.toContain(new URL(cluster.url('hangar')).host);

      const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
      console.info(
        `failover: Patroni's new primary (${newLeader.member.name}) ${s(newLeader.at - killedAt)} after the kill; ` +
          `first committed mutation ${s((firstCommitAfterKill as number) - killedAt)} after it; ` +
          `/readyz 200 ${s((readyAgainAt as number) - killedAt)} after it; ${chats.answeredBeforeBack} chats answered ` +
          `before the first commit; /readyz said: ${JSON.stringify([...unready])}`,
      );
    } finally {
      going = false;
      await Promise.allSettled([chatting, mutating, probing]);
      await graphql(`mutation { cancelTrainJob(id: "${jobId}") { __typename } }`, {}, w.operator);
    }
  }, 180_000);
});
