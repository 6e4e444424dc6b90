import { modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// serveFromRegistry end to end against the stand-in Hub, with a node agent played over GraphQL (the real agent
// speaks the same operations): the job fetches, checks, adds to the catalog, waits for a replica, and reports
// the smoke test the agent ran.

let hub: FakeHub;
let t: TestApp;
let operator: string;
let nodeToken: string;
let agent: NodeJS.Timeout;
// The node's endpoint, and the key the stand-in agent reports for its replicas (a test makes it wrong).
let endpoint: StandInReplica;
const KEY = 'hgk_serve-job-test-engine-key-0123456789abc';
let reportedKey = KEY;

const JOB = `query($id: ID!) { serveJob(id: $id) { state message steps { name state message } } }`;

async function waitForJob(id: string, timeoutMs = 30_000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const r = await t.gql(JOB, { id }, { token: operator });
    const job = r.data?.serveJob;
    if (job && (job.state === 'DONE' || job.state === 'FAILED')) return job;
    if (Date.now() > end) throw new Error(`job did not end: ${JSON.stringify(job)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const start = async (args: string) => {
  const r = await t.gql(
    `mutation { serveFromRegistry(${args}) { __typename ... on ServeJob { id state steps { name state } } ... on Error { message } } }`,
    {},
    { token: operator },
  );
  return r.data?.serveFromRegistry;
};

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
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  await t.app.start();
  operator = await t.token('OPERATOR', 'serve-ops');
  const admin = await t.token('ADMIN', 'serve-admin');
  nodeToken = (
    await t.gql('mutation { createNode(name: "gpu-1") { ... on CreatedNode { token } } }', {}, { token: admin })
  ).data?.createNode.token;
  // The stand-in agent: reports the node, and answers every assignment as the real one would.
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
          ? { replicaId: a.replicaId, state: 'READY', endpoint: endpoint.endpoint, engineKey: reportedKey }
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
});
afterAll(async () => {
  clearInterval(agent);
  await t?.close();
  await hub?.close();
  await endpoint?.close();
});

describe('serveFromRegistry', () => {
  it('runs every step to a smoke test', async () => {
    const job = await start('repo: "acme/Tiny-GGUF"');
    expect(job).toMatchObject({
      __typename: 'ServeJob',
      steps: [
        { name: 'registry' },
        { name: 'mirror' },
        { name: 'check' },
        { name: 'catalog' },
        { name: 'replica' },
        { name: 'smoke' },
      ],
    });
    const done = await waitForJob(job.id);
    expect(done.state).toBe('DONE');
    expect(done.steps.map((s: { state: string }) => s.state)).toEqual(['DONE', 'DONE', 'DONE', 'DONE', 'DONE', 'DONE']);
    // No quantisation asked: the first by preference that fits, named in the step.
    expect(done.steps[0].message).toMatch(
      /^no quantisation asked: took Q4_K_M, the first by preference that fits on a node now: model:Tiny-Q4_K_M: 1 file\(s\), [\d.]+ (bytes|KiB|MiB) at feedbee$/,
    );
    expect(done.steps[1].message).toBe('tiny/feedbee-q4_k_m present and verified');
    // What the registry step resolved the default branch to is kept as what the Hub named for main (/hf reads it).
    expect(await t.app.db.prisma.hubRef.findMany({ select: { repo: true, ref: true, commit: true } })).toEqual([
      { repo: 'acme/tiny-gguf', ref: 'main', commit: 'feedbeef11111111111111111111111111111111' },
    ]);
    // Each step ran its own handler (the table in serve-job-steps.ts): the check says what the model needs, and
    // the catalog step, after it, says something else.
    expect(done.steps[2].message).toMatch(/: needs \S+ GiB at \S+ tokens; fits on /);
    expect(done.steps[3].message).not.toMatch(/ GiB at /);
    expect(done.steps[4].message).toBe('ready on gpu-1');
    // Its own request through the replica's endpoint, with the engine key: the answer, speed and first token.
    expect(done.message).toMatch(/^answered " Hello there!" at [\d.]+ tokens\/s, first token in \d+ ms$/);
    const smokes = endpoint.requests.filter((r) => r.body.model === 'tiny');
    expect(smokes.length).toBeGreaterThanOrEqual(2); // the replica's readiness, then the job's smoke step
    expect(smokes.every((r) => r.authorization === `Bearer ${KEY}`)).toBe(true);
    const model = await t.gql('{ model(name: "tiny") { mode replicas { state smokeText } } }', {}, { token: operator });
    expect(model.data?.model).toEqual({ mode: 'ALWAYS', replicas: [{ state: 'READY', smokeText: ' Hello there!' }] });
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'serveMirrorVersion' },
      orderBy: { id: 'desc' },
    });
    expect(audit?.actor).toBe(`system:serve job ${job.id} for admin@example.com`);
  });

  it('names what the repository has when the quantisation is not there', async () => {
    const job = await start('repo: "acme/Tiny-GGUF", quant: "Q8_0"');
    const done = await waitForJob(job.id);
    expect(done).toMatchObject({ state: 'FAILED', message: 'registry: acme/Tiny-GGUF has no Q8_0 set; it has Q4_K_M' });
    expect(done.steps.slice(1).every((s: { state: string }) => s.state === 'QUEUED')).toBe(true);
  });

  it('stops early, done, for an on-demand model', async () => {
    await t.gql('mutation { removeModel(name: "tiny") { __typename } }', {}, { token: operator });
    const job = await start('repo: "acme/Tiny-GGUF", onDemand: true');
    const done = await waitForJob(job.id);
    expect(done.state).toBe('DONE');
    expect(done.message).toBe('tiny is on demand: no replica runs until it is asked for (wakeModel)');
    expect(done.steps.at(-1).state).toBe('QUEUED');
  });

  it('survives a server restart mid-job, resuming at the step it was on', async () => {
    // A slow registry (every call waits), so the job is still at its first steps when the server stops.
    const tiny = hub.repos.get('acme/Tiny-GGUF')!;
    hub.repos.set('acme/Slow-GGUF', {
      ...tiny,
      id: 'acme/Slow-GGUF',
      sha: '5105105100000000000000000000000000000000',
      delayMs: 700,
    });
    const job = await start('repo: "acme/Slow-GGUF"');
    for (let i = 0; i < 100; i++) {
      const row = await t.app.db.prisma.serveJobStep.findFirst({ where: { jobId: job.id, name: 'registry' } });
      if (row?.state === 'RUNNING') break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await t.restart();
    const mid = await t.app.db.prisma.serveJob.findUniqueOrThrow({ where: { id: job.id } });
    expect(mid).toMatchObject({ state: 'RUNNING', leaseOwner: null });
    hub.repos.get('acme/Slow-GGUF')!.delayMs = 0;
    await t.app.start();
    const done = await waitForJob(job.id);
    expect(done.state).toBe('DONE');
    expect(done.message).toMatch(/^answered " Hello there!" at [\d.]+ tokens\/s/);
    expect(done.steps[1].message).toBe('slow/5105105-q4_k_m present and verified');
  });

  it('fails at the replica, saying why, when its endpoint refuses the key it was given', async () => {
    const tiny = hub.repos.get('acme/Tiny-GGUF')!;
    hub.repos.set('acme/Keyed-GGUF', {
      ...tiny,
      id: 'acme/Keyed-GGUF',
      sha: '4e4e4e4e00000000000000000000000000000000',
    });
    reportedKey = 'hgk_a-key-the-endpoint-does-not-take-012345678';
    try {
      const job = await start('repo: "acme/Keyed-GGUF"');
      const done = await waitForJob(job.id);
      expect(done.state).toBe('FAILED');
      expect(done.message).toMatch(
        /^replica: the replica failed on gpu-1: smoke test: http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions refused the engine key \(HTTP 401/,
      );
      expect(done.message).not.toContain(reportedKey);
    } finally {
      reportedKey = KEY;
    }
  });

  it("fails at the catalog step when a team's adapter holds the model's name, and does not say whose", async () => {
    // The adapter's team is one the job's creator is not in: the job's steps are read by others too.
    const p = t.app.db.prisma;
    const org = await p.org.create({ data: { name: 'held-org' } });
    const team = await p.team.create({ data: { orgId: org.id, name: 'held-team' } });
    const base = await p.catalogModel.create({
      data: { name: 'held-base', source: 'http://mirror.example/m.gguf', engine: 'llamacpp', maxReplicas: 0 },
    });
    await p.adapter.create({
      data: { name: 'held', source: 'http://mirror.example/a.gguf', modelId: base.id, owner: `team:${team.id}` },
    });
    hub.repos.set('acme/Held-GGUF', {
      ...hub.repos.get('acme/Tiny-GGUF')!,
      id: 'acme/Held-GGUF',
      sha: '4e1d4e1d00000000000000000000000000000000',
    });
    const job = await start('repo: "acme/Held-GGUF"');
    const done = await waitForJob(job.id);
    expect(done).toMatchObject({ state: 'FAILED', message: 'catalog: the name held is taken: choose another name' });
    expect(await p.catalogModel.findUnique({ where: { name: 'held' } })).toBeNull();
  });

  it('refuses a malformed repository name and starts nothing', async () => {
    const before = await t.app.db.prisma.serveJob.count();
    const r = await start('repo: "not a repo"');
    expect(r).toMatchObject({ __typename: 'ValidationError' });
    expect(await t.app.db.prisma.serveJob.count()).toBe(before);
  });
});
