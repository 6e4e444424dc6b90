import { modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DbRelay, relayedDatabase } from '../../test/fixtures/db-relay.js';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// A serve job in the middle of its work when the database goes away (reached through a relay the test cuts, so
// every pooled connection is reset and new ones are refused) and comes back: the control plane being down is
// not the job's failure. It waits, then goes on at the step it was on, and ends DONE.

let hub: FakeHub;
let relay: DbRelay;
let t: TestApp;
let operator: string;
let nodeToken: string;
let agent: NodeJS.Timeout;
/** Whether the stand-in agent says its replicas are READY (else LOADING: the job waits at its replica step). */
let replicasReady = false;

const JOB = `query($id: ID!) { serveJob(id: $id) { state message steps { name state message } } }`;
const job = async (id: string) => (await t.gql(JOB, { id }, { token: operator })).data?.serveJob;

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// The replica's endpoint on the node, which the control plane smoke-tests with the key the agent reported.
let endpoint: StandInReplica;
const KEY = 'hgk_outage-test-engine-key-0123456789abcdefg';

beforeAll(async () => {
  endpoint = await startStandInReplica({ key: KEY });
  hub = await startFakeHub();
  const tiny = modelHeader({ arch: 'llama', layers: 2, embd: 64, heads: 4, kvHeads: 4, ctx: 2048, tensorType: 0 });
  hub.repos.set('acme/Tiny-GGUF', {
    id: 'acme/Tiny-GGUF',
    sha: 'feedbeef11111111111111111111111111111111',
    tags: ['gguf'],
    files: [{ path: 'Tiny-Q4_K_M.gguf', head: tiny.header, size: tiny.size, lfs: true }],
  });
  t = await startTestApp(
    { HANGAR_HUB_URL: hub.url },
    {
      database: async () => {
        relay = await relayedDatabase();
        return relay.database;
      },
    },
  );
  await t.app.start();
  operator = await t.token('OPERATOR', 'outage-ops');
  const admin = await t.token('ADMIN', 'outage-admin');
  nodeToken = (
    await t.gql('mutation { createNode(name: "gpu-1") { ... on CreatedNode { token } } }', {}, { token: admin })
  ).data?.createNode.token;
  // The stand-in agent, as in serve-job.test.ts; its calls fail while the database is away, like a real one's.
  const tick = async () => {
    await t.gql(
      'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
      {
        i: {
          gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 }],
          engines: [{ name: 'llama.cpp', build: 6000 }],
        },
      },
      { token: nodeToken },
    );
    const assigned =
      (await t.gql('{ nodeAssignments { replicaId desired } }', {}, { token: nodeToken })).data?.nodeAssignments ?? [];
    for (const a of assigned) {
      const i =
        a.desired === 'RUN'
          ? replicasReady
            ? { replicaId: a.replicaId, state: 'READY', endpoint: endpoint.endpoint, engineKey: KEY }
            : { replicaId: a.replicaId, state: 'LOADING' }
          : { replicaId: a.replicaId, state: 'STOPPED' };
      await t.gql(
        'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename } }',
        { i },
        { token: nodeToken },
      );
    }
  };
  await tick();
  agent = setInterval(() => void tick().catch(() => {}), 300);
}, 60_000);

afterAll(async () => {
  clearInterval(agent);
  await relay?.mend().catch(() => {});
  await t?.close();
  await hub?.close();
  await endpoint?.close();
});

describe('a serve job when the database goes away', () => {
  it('waits for it and goes on at the step it was on, failing nothing', async () => {
    const started = await t.gql(
      'mutation { serveFromRegistry(repo: "acme/Tiny-GGUF") { __typename ... on ServeJob { id } ... on Error { message } } }',
      {},
      { token: operator },
    );
    const id = started.data?.serveFromRegistry.id as string;
    expect(id, JSON.stringify(started)).toBeTruthy();
    // At its replica step: the replica is placed and loading, and the job polls for it to be ready.
    await waitFor(
      'the replica step',
      async () => {
        const j = await job(id);
        return j?.steps.find((s: { name: string }) => s.name === 'replica')?.state === 'RUNNING' ? j : undefined;
      },
      30_000,
    );

    await relay.cut();
    // Long enough for several of the job's polls (one a second) and the runner's claims to fail.
    await new Promise((r) => setTimeout(r, 3500));
    await relay.mend();
    replicasReady = true;

    const done = await waitFor(
      'the job to end',
      async () => {
        const j = await job(id);
        return j && (j.state === 'DONE' || j.state === 'FAILED') ? j : undefined;
      },
      20_000,
    );
    expect(done.steps.filter((s: { state: string }) => s.state === 'FAILED')).toEqual([]);
    expect(done).toMatchObject({
      state: 'DONE',
      message: expect.stringMatching(/^answered " Hello there!" at [\d.]+ tokens\/s/),
    });
    expect(t.app.services.serveJobs.health.paused).toBeNull();
  }, 60_000);
});
