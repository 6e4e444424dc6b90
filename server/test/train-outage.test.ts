import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DbRelay, relayedDatabase } from './fixtures/db-relay.js';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// The lost clock of a running training job counts only while the control plane can hear the node. Here the
// control plane stays up but loses its database (the relay to a real PostgreSQL is cut) for longer than
// HANGAR_TRAIN_LOST_SECONDS: the node's reports could not have landed, so the job must not be failed as lost when
// the database is back. A node that then stays silent is still failed, the lost time after the return.

const CLAIM = `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }`;
const REPORT = `mutation($id: ID!, $input: TrainProgressInput!) { reportTrainProgress(id: $id, input: $input) { __typename ... on TrainJob { step } ... on Error { message } } }`;

let t: TestApp;
let hub: FakeHub;
let relay: DbRelay;
let w: TrainingWorld;

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp(
    { HANGAR_HUB_URL: hub.url, HANGAR_TRAIN_LOST_SECONDS: '5' },
    {
      database: async () => {
        relay = await relayedDatabase();
        return relay.database;
      },
    },
  );
  const base = await t.app.start();
  w = await trainingWorld(t, base, hub);
});
afterAll(async () => {
  await t.close();
  await hub.close();
});

const job = (id: string) => t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });

describe('the lost clock and the database', () => {
  it('does not fail a running job for the silence while the control plane had no database', async () => {
    const created = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name: 'outage-job',
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 4000,
          public: true,
          data: PAIRS,
        },
      },
      { token: w.operator },
    );
    const id = created.data?.createTrainJob.id as string;
    expect((await t.gql(CLAIM, { id }, { token: w.nodeToken })).data?.claimTrainJob.__typename).toBe('TrainClaim');
    const step = { id, input: { steps: 10, points: [{ step: 1, loss: 2 }] } };
    expect((await t.gql(REPORT, step, { token: w.nodeToken })).data?.reportTrainProgress).toEqual({
      __typename: 'TrainJob',
      step: 1,
    });

    await relay.cut();
    // Longer than the lost time; the sweeps meanwhile find no database.
    await new Promise((r) => setTimeout(r, 6500));
    await relay.mend();
    // Until a sweep gets through again (the first after the return may still meet a dead pooled connection).
    const deadline = Date.now() + 30_000;
    do {
      await t.app.services.train.sweep();
      if (Date.now() > deadline) throw new Error('no sweep reached the database again in 30 s');
    } while (t.app.services.train.health.paused);

    expect((await job(id)).state).toBe('RUNNING');
    // The node's report, kept while it could not land, is taken now and holds the lease again.
    const later = { id, input: { points: [{ step: 2, loss: 1.5 }] } };
    expect((await t.gql(REPORT, later, { token: w.nodeToken })).data?.reportTrainProgress).toEqual({
      __typename: 'TrainJob',
      step: 2,
    });

    // Silent from here on, with the control plane and its database up: failed as lost, as ever.
    await t.app.services.train.sweep(new Date(Date.now() + 6000));
    const failed = await job(id);
    expect(failed.state).toBe('FAILED');
    expect(failed.message).toMatch(/gpu-1 stopped reporting for 5 s/);
  }, 60_000);
});
