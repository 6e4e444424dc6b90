import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, reportGpu, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// The server's wall clock jumps ten minutes ahead (an NTP step after a suspended VM wakes, an operator setting the
// date) while a node keeps reporting every few seconds. The database's clock does not move: leases and liveness
// are judged on it, so the running job stays RUNNING and the node online. A node that really goes silent is still
// judged lost, on the database's clock. Only this process's Date is moved (vitest's fake Date, advancing with real
// time from the jump on); timers and the monotonic clock run on as before, as they do on a real machine.

const JUMP_MS = 10 * 60_000;
const CLAIM = `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }`;
const REPORT = `mutation($id: ID!, $input: TrainProgressInput!) { reportTrainProgress(id: $id, input: $input) { __typename ... on TrainJob { step } ... on Error { message } } }`;
const NODES = '{ nodes { name online } }';

let t: TestApp;
let hub: FakeHub;
let w: TrainingWorld;

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_TRAIN_LOST_SECONDS: '5' });
  const base = await t.app.start();
  w = await trainingWorld(t, base, hub);
});
afterEach(() => {
  vi.useRealTimers();
});
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

const job = (id: string) => t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });
const online = async () =>
  (await t.gql(NODES, {}, { token: w.operator })).data?.nodes.find((n: { name: string }) => n.name === 'gpu-1')?.online;

/** The process's wall clock jumps by `ms` and runs on from there; nothing else about time changes. */
function jumpWallClock(ms: number) {
  const jumped = Date.now() + ms;
  vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
  vi.setSystemTime(jumped);
}

async function runningJob(name: string) {
  const created = await t.gql(
    `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
    { i: { name, model: 'tiny', baseRepo: BASE_REPO, node: 'gpu-1', gpuMiB: 4000, public: true, data: PAIRS } },
    { token: w.operator },
  );
  const id = created.data?.createTrainJob.id as string;
  expect((await t.gql(CLAIM, { id }, { token: w.nodeToken })).data?.claimTrainJob.__typename).toBe('TrainClaim');
  return id;
}

const report = async (id: string, step: number) =>
  (await t.gql(REPORT, { id, input: { steps: 100, points: [{ step, loss: 2 }] } }, { token: w.nodeToken })).data
    ?.reportTrainProgress;

describe('a jump of the wall clock', () => {
  it('fails no running job and takes no node offline while the node keeps reporting', async () => {
    const id = await runningJob('clock-jump');
    expect(await report(id, 1)).toEqual({ __typename: 'TrainJob', step: 1 });
    await reportGpu(t, w.nodeToken, 20_000);
    expect(await online()).toBe(true);

    jumpWallClock(JUMP_MS);
    // The first sweep and read after the jump, before the node's next report (it reports every 2 s).
    await t.app.services.train.sweep();
    expect((await job(id)).state).toBe('RUNNING');
    expect(await online()).toBe(true);

    // The node goes on reporting, as it did; its reports land on the database's clock, not the jumped one.
    for (let step = 2; step <= 4; step++) {
      expect(await report(id, step)).toEqual({ __typename: 'TrainJob', step });
      await reportGpu(t, w.nodeToken, 20_000);
      await t.app.services.train.sweep();
      expect((await job(id)).state).toBe('RUNNING');
      expect(await online()).toBe(true);
    }
    const lease = await t.app.db.prisma.$queryRaw<{ ahead: boolean }[]>`
      SELECT "leaseUntil" > now() + interval '60 seconds' AS ahead FROM "TrainJob" WHERE id = ${id}::uuid`;
    // The lease runs HANGAR_TRAIN_LOST_SECONDS past the database's now, not ten minutes past it.
    expect(lease[0]?.ahead).toBe(false);
  }, 60_000);

  it('still fails the job of a node that really went silent, on the database clock', async () => {
    const id = await runningJob('clock-jump-silent');
    expect(await report(id, 1)).toEqual({ __typename: 'TrainJob', step: 1 });
    // Back, not forward: a sweep judging by this process's wall clock would then never find the lease past, and
    // the job would stay RUNNING (forward, it would fail at once and this test could not tell).
    jumpWallClock(-JUMP_MS);
    // Silent from here: the sweeps every 2 s find its lease past the database's now after 5 s.
    const deadline = performance.now() + 30_000;
    while ((await job(id)).state === 'RUNNING') {
      if (performance.now() > deadline) throw new Error('the silent node was not judged lost in 30 s');
      await new Promise((r) => setTimeout(r, 250));
    }
    const failed = await job(id);
    expect(failed.state).toBe('FAILED');
    expect(failed.message).toMatch(/gpu-1 stopped reporting for 5 s/);
  }, 60_000);

  it('takes a node that went silent offline, on the database clock', async () => {
    await reportGpu(t, w.nodeToken, 20_000);
    jumpWallClock(-JUMP_MS);
    expect(await online()).toBe(true);
    // Its last report 31 s ago by the database's clock (the online window is 30 s): what silence leaves.
    await t.app.db.prisma
      .$executeRaw`UPDATE "Node" SET "lastSeenAt" = now() - interval '31 seconds' WHERE name = 'gpu-1'`;
    expect(await online()).toBe(false);
  }, 60_000);
});
