import fs from 'node:fs/promises';
import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import {
  BASE_REPO,
  PAIRS,
  reportGpu,
  type TrainingWorld,
  tarOf,
  trainingWorld,
  writeAdapterDir,
} from '../../test/fixtures/training.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// Training jobs through the real server and PostgreSQL: submission and its refusals, the node's side of the
// contract (docs/training.md), uploads, cancel, lost nodes, delete and publish.

let t: TestApp;
let hub: FakeHub;
let base: string;
let w: TrainingWorld;

const JOB = `id name model state step steps loss peakMiB jobMessage: message cancelRequested owner pairs dataSha256 gguf params
  node { name } metrics { step loss } events { level message } artifacts { kind size sha256 url filename } adapter`;
const CREATE = `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename
  ... on TrainJob { ${JOB} } ... on Error { message } ... on ValidationError { field } } }`;
const CLAIM = `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on TrainClaim { spec job { id state } } ... on Error { message } } }`;
const REPORT = `mutation($id: ID!, $input: TrainProgressInput!) { reportTrainProgress(id: $id, input: $input) { __typename ... on TrainJob { step steps loss } ... on Error { message } } }`;
const FINISH = `mutation($id: ID!, $state: JobState!, $message: String) { finishTrainJob(id: $id, state: $state, message: $message) { __typename ... on TrainJob { state jobMessage: message } ... on Error { message } } }`;
const GET = `query($id: ID!) { trainJob(id: $id) { ${JOB} } }`;

const valid = () => ({
  name: `adapter-${Math.random().toString(36).slice(2, 8)}`,
  model: 'tiny',
  baseRepo: BASE_REPO,
  node: 'gpu-1',
  gpuMiB: 8000,
  public: true,
  data: PAIRS,
  params: { rank: 4, epochs: 1, batch: 4 },
});

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_TRAIN_LOST_SECONDS: '5' });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
  hub.repos.set('hangar-test/quantised', {
    id: 'hangar-test/quantised',
    sha: 'c'.repeat(40),
    files: [{ path: 'model-Q4_K_M.gguf', head: Buffer.from('GGUF'), size: 1000, lfs: true }],
  });
});
afterAll(async () => {
  await t.close();
  await hub.close();
});
// Jobs of one test must not be the node's queued work in the next.
beforeEach(async () => {
  await t.app.db.prisma.trainJob.updateMany({
    where: { state: { in: ['QUEUED', 'RUNNING'] } },
    data: { state: 'CANCELLED', leaseOwner: null },
  });
  await reportGpu(t, w.nodeToken, 20_000);
});

const create = async (input: Record<string, unknown>) => {
  const r = await t.gql(CREATE, { i: input }, { token: w.operator });
  if (!r.data?.createTrainJob) throw new Error(JSON.stringify(r.errors));
  return r.data.createTrainJob;
};

async function running(input: Record<string, unknown> = {}) {
  const job = await create({ ...valid(), ...input });
  expect(job.__typename).toBe('TrainJob');
  const claim = (await t.gql(CLAIM, { id: job.id }, { token: w.nodeToken })).data?.claimTrainJob;
  expect(claim.__typename).toBe('TrainClaim');
  return { job, spec: claim.spec };
}

async function snapshot() {
  const p = t.app.db.prisma;
  return JSON.stringify({
    jobs: await p.trainJob.findMany({
      orderBy: { id: 'asc' },
      select: { id: true, state: true, message: true, step: true },
    }),
    metrics: await p.trainMetric.count(),
    events: await p.trainEvent.count(),
    artifacts: await p.trainArtifact.count(),
    adapters: await p.adapter.findMany({ orderBy: { name: 'asc' } }),
  });
}

describe('createTrainJob', () => {
  it('queues a job with its pairs kept by sha256 in the store, and says why it waits', async () => {
    const job = await create(valid());
    expect(job).toMatchObject({
      __typename: 'TrainJob',
      state: 'QUEUED',
      pairs: 12,
      gguf: true,
      node: { name: 'gpu-1' },
      owner: null,
    });
    expect(job.params).toEqual({
      rank: 4,
      alpha: 32,
      dropout: 0.05,
      epochs: 1,
      lr: 2e-4,
      batch: 4,
      max_len: 1024,
      seed: 42,
    });
    expect(job.jobMessage).toBe('waiting for node gpu-1 to start it');
    const row = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id: job.id } });
    expect(await fs.readFile(row.dataPath, 'utf8')).toBe(PAIRS);
    expect(job.dataSha256).toMatch(/^[0-9a-f]{64}$/);
    const audit = await t.app.db.prisma.auditEvent.findFirst({ where: { action: 'createTrainJob', target: job.name } });
    expect(audit?.outcome).toBe('DONE');
  });

  it('says a job waits when its node has too little GPU memory free, and is not offered to the node', async () => {
    await reportGpu(t, w.nodeToken, 1000);
    const job = await create(valid());
    expect(job.jobMessage).toBe(
      'waiting for node gpu-1: its GPUs report at most 1000 MiB free; the job needs 8000 MiB',
    );
    expect((await t.app.services.train.work(w.nodeId)).map((j) => j.id)).not.toContain(job.id);
    await reportGpu(t, w.nodeToken, 20_000);
    expect((await t.app.services.train.work(w.nodeId)).map((j) => j.id)).toContain(job.id);
  });

  // Every refusal names its field (or the data's line) and changes nothing but the audit log.
  const refusals: [string, (v: Record<string, unknown>) => Record<string, unknown>, string, RegExp][] = [
    ['a bad name', (v) => ({ ...v, name: 'no spaces please' }), 'name', /letters, digits/],
    ['a name over 100', (v) => ({ ...v, name: 'a'.repeat(101) }), 'name', /up to 100/],
    ["a model's name", (v) => ({ ...v, name: 'tiny' }), 'name', /already a model's or an adapter's name/],
    ['a model not in the catalog', (v) => ({ ...v, model: 'nope' }), 'model', /no model nope in the catalog/],
    ['a base repo that is not owner/name', (v) => ({ ...v, baseRepo: 'just-a-name' }), 'baseRepo', /owner\/name/],
    ['a GGUF base repo by its name', (v) => ({ ...v, baseRepo: 'someone/Model-GGUF' }), 'baseRepo', /GGUF repository/],
    [
      'a base repo holding only GGUF files',
      (v) => ({ ...v, baseRepo: 'hangar-test/quantised' }),
      'baseRepo',
      /holds GGUF files, not safetensors/,
    ],
    [
      'a base repo the registry does not have',
      (v) => ({ ...v, baseRepo: 'hangar-test/missing' }),
      'baseRepo',
      /no such repository/,
    ],
    ['a bad base revision', (v) => ({ ...v, baseRevision: '../x' }), 'baseRevision', /branch, a tag or a commit/],
    ['an unknown node', (v) => ({ ...v, node: 'gpu-9' }), 'node', /no node gpu-9/],
    ['zero GPU memory', (v) => ({ ...v, gpuMiB: 0 }), 'gpuMiB', /more than 0/],
    // It would wait in the queue forever: the node's H100 has 81559 MiB in all.
    [
      'more GPU memory than the largest card',
      (v) => ({ ...v, gpuMiB: 999_999 }),
      'gpuMiB',
      /asks for 999999 MiB .* its largest card is GPU 0 \(H100\) with 81559 MiB/,
    ],
    ['no data', (v) => ({ ...v, data: undefined }), 'data', /either inline/],
    ['data and a sha256', (v) => ({ ...v, dataSha256: 'a'.repeat(64) }), 'data', /either inline/],
    [
      'an unknown data sha256',
      (v) => ({ ...v, data: undefined, dataSha256: 'a'.repeat(64) }),
      'dataSha256',
      /upload it with POST \/api\/train\/data/,
    ],
    ['a line that is not JSON', (v) => ({ ...v, data: `${PAIRS}\n{"q": "x", "a": ` }), 'data', /^line 13: not JSON/],
    [
      'a line without an answer',
      (v) => ({ ...v, data: `{"q":"a","a":"b"}\n\n{"q": "x"}` }),
      'data',
      /^line 3: needs "q" and "a"/,
    ],
    ['an empty answer', (v) => ({ ...v, data: '{"q":"a","a":"  "}' }), 'data', /^line 1: an empty a/],
    ['no pairs at all', (v) => ({ ...v, data: '\n\n' }), 'data', /holds no pairs/],
    [
      'an unknown param',
      (v) => ({ ...v, params: { rank: 4, warmup: 10 } }),
      'params.warmup',
      /not a trainer setting; the trainer takes rank/,
    ],
    ['a param that is not a number', (v) => ({ ...v, params: { lr: 'fast' } }), 'params.lr', /from 1e-7 to 0.01/],
    ['public and an owner', (v) => ({ ...v, owner: 'org:acme' }), 'owner', /public or has an owner, not both/],
    ['neither public nor an owner', (v) => ({ ...v, public: undefined }), 'owner', /name the adapter's owner/],
    ['an owner in an unknown form', (v) => ({ ...v, public: undefined, owner: 'galaxy:far' }), 'owner', /org:|team:/],
    [
      'a collection that does not exist',
      (v) => ({
        ...v,
        public: undefined,
        owner: undefined,
        data: '{"q":"a","a":"b","collection":"00000000-0000-0000-0000-000000000000"}',
      }),
      'data',
      /collection 00000000-0000-0000-0000-000000000000, which is not here/,
    ],
  ];
  const ranges: [string, number][] = [
    ['rank', 0],
    ['rank', 257],
    ['rank', 2.5],
    ['alpha', 0],
    ['alpha', 1025],
    ['dropout', -0.1],
    ['dropout', 0.95],
    ['epochs', 0],
    ['epochs', 101],
    ['lr', 1e-8],
    ['lr', 0.1],
    ['batch', 0],
    ['batch', 129],
    ['max_len', 15],
    ['max_len', 32769],
    ['seed', -1],
    ['seed', 2 ** 31 + 1],
  ];
  for (const [param, value] of ranges)
    refusals.push([
      `params.${param} = ${value}`,
      (v) => ({ ...v, params: { [param]: value } }),
      `params.${param}`,
      new RegExp(`params\\.${param} .* is .*from`),
    ]);

  it.each(refusals)(
    'refuses %s, naming the field, and changes nothing but the audit log',
    async (_what, edit, field, message) => {
      const before = await snapshot();
      const audits = await t.app.db.prisma.auditEvent.count({
        where: { action: 'createTrainJob', outcome: 'REFUSED' },
      });
      const r = await create(edit(valid()));
      expect(r.__typename).toBe('ValidationError');
      expect(r.field).toBe(field);
      expect(r.message).toMatch(message);
      expect(await snapshot()).toBe(before);
      expect(await t.app.db.prisma.auditEvent.count({ where: { action: 'createTrainJob', outcome: 'REFUSED' } })).toBe(
        audits + 1,
      );
    },
  );

  it('refuses an adapter name a published adapter already has', async () => {
    const model = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'tiny' } });
    await t.app.db.prisma.adapter.create({ data: { name: 'taken-adapter', source: 'x', modelId: model.id } });
    const before = await snapshot();
    const r = await create({ ...valid(), name: 'taken-adapter' });
    expect(r).toMatchObject({ __typename: 'ValidationError', field: 'name' });
    expect(await snapshot()).toBe(before);
    await t.app.db.prisma.adapter.delete({ where: { name: 'taken-adapter' } });
  });

  it('refuses viewers and anonymous callers', async () => {
    const viewer = await t.token('VIEWER', 'train-viewer');
    const r = await t.gql(CREATE, { i: valid() }, { token: viewer });
    expect(r.data?.createTrainJob.__typename).toBe('ForbiddenError');
  });
});

describe('pairs from knowledge-base collections', () => {
  let collectionId: string;
  let otherTeam: string;
  beforeAll(async () => {
    const p = t.app.db.prisma;
    const org = await p.org.create({ data: { name: 'acme' } });
    const research = await p.team.create({ data: { orgId: org.id, name: 'research' } });
    await p.team.create({ data: { orgId: org.id, name: 'sales' } });
    otherTeam = 'team:acme/sales';
    const c = await p.collection.create({
      data: { name: 'handbook', ownerScope: 'team', ownerId: research.id, orgId: org.id },
    });
    collectionId = c.id;
  });
  const kbPairs = () =>
    `{"q":"Who?","a":"Us.","collection":"${collectionId}"}\n{"q":"Where?","a":"Here.","collection":"${collectionId}"}`;

  it("defaults the owner to the single collection's owner", async () => {
    const job = await create({ ...valid(), public: undefined, data: kbPairs() });
    expect(job.__typename).toBe('TrainJob');
    const team = await t.app.db.prisma.team.findFirstOrThrow({ where: { name: 'research' } });
    expect(job.owner).toBe(`team:${team.id}`);
  });
  it('refuses making such an adapter public', async () => {
    const before = await snapshot();
    const r = await create({ ...valid(), data: kbPairs() });
    expect(r).toMatchObject({ __typename: 'ValidationError', field: 'public' });
    expect(r.message).toMatch(/never to everyone/);
    expect(await snapshot()).toBe(before);
  });
  it('refuses an owner who may not read the collection', async () => {
    const before = await snapshot();
    const r = await create({ ...valid(), public: undefined, owner: otherTeam, data: kbPairs() });
    expect(r).toMatchObject({ __typename: 'ValidationError', field: 'owner' });
    expect(r.message).toMatch(/may not read collection handbook/);
    expect(await snapshot()).toBe(before);
  });
});

describe('checkTrainData', () => {
  it('reports pairs, bad lines by number, duplicates and lengths', async () => {
    const data = '{"q":"hi","a":"hello"}\nnot json\n{"q":"hi","a":"hello"}\n{"q":"longer question","a":"a"}\n';
    const r = await t.gql(
      `query($d: String!) { checkTrainData(data: $d) { pairs ok errorCount errors { line message } duplicateCount duplicates { line sameAs } question { min max } answer { min max } sha256 } }`,
      { d: data },
      { token: w.operator },
    );
    const report = r.data?.checkTrainData;
    expect(report).toMatchObject({
      pairs: 3,
      ok: false,
      errorCount: 1,
      duplicateCount: 1,
      duplicates: [{ line: 3, sameAs: 1 }],
      question: { min: 2, max: 15 },
      answer: { min: 1, max: 5 },
    });
    expect(report.errors[0]).toMatchObject({ line: 2 });
  });
  it("counts tokens with the model's own tokenizer when a model is named, and says why not when it cannot", async () => {
    const long = 'word '.repeat(40);
    const data = `{"q":"What is the capital of France?","a":"Paris."}\n{"q":"${long}","a":"${long}"}`;
    const q = `query($d: String!, $m: String, $l: Int) { checkTrainData(data: $d, model: $m, maxLen: $l) {
      tokens { model question { min max } answer { min max } pair { max } maxLen overMaxLen } tokensNote } }`;
    const r = (await t.gql(q, { d: data, m: 'tiny', l: 32 }, { token: w.operator })).data?.checkTrainData;
    expect(r.tokensNote).toBeNull();
    expect(r.tokens).toMatchObject({ model: 'tiny', maxLen: 32, overMaxLen: 1 });
    // LLaMA's SentencePiece vocabulary: a short question is a handful of tokens, "word " forty times about forty.
    expect(r.tokens.question.min).toBeGreaterThanOrEqual(5);
    expect(r.tokens.question.min).toBeLessThanOrEqual(12);
    expect(r.tokens.question.max).toBeGreaterThanOrEqual(40);
    expect(r.tokens.pair.max).toBe(r.tokens.question.max + r.tokens.answer.max);
    const none = (await t.gql(q, { d: data }, { token: w.operator })).data?.checkTrainData;
    expect(none).toEqual({ tokens: null, tokensNote: 'name the model to count tokens with its tokenizer' });
    const missing = (await t.gql(q, { d: data, m: 'nope' }, { token: w.operator })).data?.checkTrainData;
    expect(missing.tokensNote).toBe('no token counts: the model nope is not in the catalog');
  });

  it('takes uploads over HTTP up to 64 MiB and refuses more before reading it', async () => {
    const up = await fetch(`${base}/api/train/data`, {
      method: 'POST',
      headers: { authorization: `Bearer ${w.operator}` },
      body: PAIRS,
    });
    expect(up.status).toBe(200);
    const report = await up.json();
    expect(report).toMatchObject({ pairs: 12, ok: true });
    const job = await create({ ...valid(), data: undefined, dataSha256: report.sha256 });
    expect(job).toMatchObject({ __typename: 'TrainJob', pairs: 12, dataSha256: report.sha256 });
    const big = await fetch(`${base}/api/train/data`, {
      method: 'POST',
      headers: { authorization: `Bearer ${w.operator}`, 'content-length': String(65 * 1024 * 1024) },
      body: 'x',
    }).catch((e) => e);
    if (!(big instanceof Error)) expect(big.status).toBe(413);
  });
});

describe('the node side', () => {
  it('lets exactly one of many concurrent claims win', async () => {
    const job = await create(valid());
    const claims = await Promise.all(
      Array.from({ length: 8 }, () => t.gql(CLAIM, { id: job.id }, { token: w.nodeToken })),
    );
    const kinds = claims.map((c) => c.data?.claimTrainJob.__typename);
    expect(kinds.filter((k) => k === 'TrainClaim')).toHaveLength(1);
    expect(kinds.filter((k) => k === 'ConflictError')).toHaveLength(7);
    const won = claims.find((c) => c.data?.claimTrainJob.__typename === 'TrainClaim')?.data?.claimTrainJob;
    expect(won.spec).toMatchObject({
      id: job.id,
      base_repo: BASE_REPO,
      gguf: true,
      params: { rank: 4 },
      data: { pairs: 12 },
    });
    expect(won.spec.base.files.map((f: { path: string }) => f.path).sort()).toEqual([
      'config.json',
      'model.safetensors',
      'tokenizer_config.json',
    ]);
    expect(won.spec.data.url).toBe(`${base}/api/train/jobs/${job.id}/data`);
    const data = await fetch(won.spec.data.url, { headers: { authorization: `Bearer ${w.nodeToken}` } });
    expect(await data.text()).toBe(PAIRS);
    expect((await fetch(won.spec.data.url)).status).toBe(401);
  });

  it('sends the base weights from the mirror once the base repository is mirrored', async () => {
    const sha = 'b'.repeat(40);
    const files = ['config.json', 'model.safetensors', 'tokenizer_config.json'];
    const started = await t.gql(
      `mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "tiny-base", version: "hf", sources: $s, force: true) { __typename ... on Error { message } } }`,
      { s: files.map((f) => ({ url: `${hub.url}/${BASE_REPO}/resolve/${sha}/${f}` })) },
      { token: w.operator },
    );
    expect(started.data?.fetchToMirror.__typename).toBe('FetchStarted');
    const end = Date.now() + 15_000;
    while ((await t.app.db.prisma.mirrorFile.count({ where: { model: 'tiny-base', state: 'PRESENT' } })) < 3) {
      if (Date.now() > end) throw new Error('the base weights did not arrive in the mirror');
      await new Promise((r) => setTimeout(r, 50));
    }
    const { spec } = await running();
    expect(spec.base.files.map((f: { url: string }) => f.url).sort()).toEqual(
      files.map((f) => `${base}/mirror/tiny-base/hf/${f}`).sort(),
    );
    expect(spec.base.files.every((f: { sha256: string | null }) => /^[0-9a-f]{64}$/.test(f.sha256 ?? ''))).toBe(true);
    const events = (await t.gql(GET, { id: spec.id }, { token: w.operator })).data?.trainJob.events;
    expect(events.map((e: { message: string }) => e.message).join('\n')).toMatch(/base weights from the mirror/);
    await t.app.db.prisma.mirrorFile.deleteMany({ where: { model: 'tiny-base' } });
  });

  it("refuses another node's claim and its reports", async () => {
    const other = await t.gql(
      'mutation { createNode(name: "gpu-2") { ... on CreatedNode { token } } }',
      {},
      { token: w.admin },
    );
    const otherToken = other.data?.createNode.token;
    const job = await create(valid());
    expect((await t.gql(CLAIM, { id: job.id }, { token: otherToken })).data?.claimTrainJob.__typename).toBe(
      'ConflictError',
    );
    await t.gql(CLAIM, { id: job.id }, { token: w.nodeToken });
    const r = await t.gql(REPORT, { id: job.id, input: { points: [{ step: 1, loss: 1 }] } }, { token: otherToken });
    expect(r.data?.reportTrainProgress.__typename).toBe('ConflictError');
  });

  it('keeps every point once, even when a report is sent twice, and ignores reports after the end', async () => {
    const { job } = await running();
    const input = {
      steps: 3,
      points: [
        { step: 1, loss: 2.5, lr: 1e-4, peakMiB: 900 },
        { step: 2, loss: 2.1, peakMiB: 950 },
      ],
    };
    await t.gql(REPORT, { id: job.id, input }, { token: w.nodeToken });
    const again = await t.gql(REPORT, { id: job.id, input }, { token: w.nodeToken });
    expect(again.data?.reportTrainProgress).toMatchObject({ step: 2, steps: 3, loss: 2.1 });
    const failed = await t.gql(
      FINISH,
      { id: job.id, state: 'FAILED', message: 'CUDA out of memory' },
      { token: w.nodeToken },
    );
    expect(failed.data?.finishTrainJob).toMatchObject({ state: 'FAILED', jobMessage: 'CUDA out of memory' });
    const before = await snapshot();
    const late = await t.gql(REPORT, { id: job.id, input: { points: [{ step: 3, loss: 1 }] } }, { token: w.nodeToken });
    expect(late.data?.reportTrainProgress.__typename).toBe('ConflictError');
    const dup = await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken });
    expect(dup.data?.finishTrainJob.__typename).toBe('ConflictError');
    expect(await snapshot()).toBe(before);
    const got = (await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob;
    expect(got.metrics).toEqual([
      { step: 1, loss: 2.5 },
      { step: 2, loss: 2.1 },
    ]);
    expect(got.peakMiB).toBe(950);
  });

  it('refuses DONE before the adapter is uploaded', async () => {
    const { job } = await running();
    const r = await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken });
    expect(r.data?.finishTrainJob.__typename).toBe('ConflictError');
    expect(r.data?.finishTrainJob.message).toMatch(/upload the adapter/);
  });

  it('pushes work over graphql-ws: the queued job when the node has room, then the cancel', async () => {
    const seen: { id: string; state: string; cancelRequested: boolean }[][] = [];
    const client = createClient({
      url: `${base.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${w.nodeToken}` },
    });
    const stop = client.subscribe(
      { query: 'subscription { nodeTrainWork { jobs { id state cancelRequested } } }' },
      { next: (m) => seen.push((m.data as any).nodeTrainWork.jobs), error: () => {}, complete: () => {} },
    );
    try {
      await until(() => seen.length > 0);
      const job = await create(valid());
      await until(() => seen.at(-1)?.some((j) => j.id === job.id && j.state === 'QUEUED') ?? false);
      await t.gql(CLAIM, { id: job.id }, { token: w.nodeToken });
      await t.gql(`mutation { cancelTrainJob(id: "${job.id}") { __typename } }`, {}, { token: w.operator });
      await until(
        () => seen.at(-1)?.some((j) => j.id === job.id && j.state === 'RUNNING' && j.cancelRequested) ?? false,
      );
      const r = await t.gql(
        FINISH,
        { id: job.id, state: 'CANCELLED', message: 'the trainer stopped on SIGTERM' },
        { token: w.nodeToken },
      );
      expect(r.data?.finishTrainJob).toMatchObject({ state: 'CANCELLED' });
      await until(() => !seen.at(-1)?.some((j) => j.id === job.id));
    } finally {
      stop();
      await client.dispose();
    }
  });
});

describe('cancel, lost nodes and delete', () => {
  it('ends a queued job at once', async () => {
    const job = await create(valid());
    const r = await t.gql(
      `mutation { cancelTrainJob(id: "${job.id}") { __typename ... on TrainJob { state jobMessage: message } } }`,
      {},
      { token: w.operator },
    );
    expect(r.data?.cancelTrainJob).toMatchObject({ state: 'CANCELLED', jobMessage: 'cancelled before it started' });
    const again = await t.gql(
      `mutation { cancelTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(again.data?.cancelTrainJob.__typename).toBe('ConflictError');
  });

  it('fails a running job whose node stops reporting, saying so', async () => {
    const { job } = await running();
    await t.app.services.train.sweep(new Date(Date.now() + 6000));
    const got = (await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob;
    expect(got.state).toBe('FAILED');
    expect(got.jobMessage).toMatch(/gpu-1 stopped reporting for 5 s/);
  });

  it('refuses to delete a job that has not ended, and deletes an ended one with its files', async () => {
    const { job } = await running();
    const before = await snapshot();
    const r = await t.gql(
      `mutation { deleteTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(r.data?.deleteTrainJob).toMatchObject({
      __typename: 'ConflictError',
      message: 'the job is running: cancel it first, then delete it',
    });
    expect(await snapshot()).toBe(before);
    await t.gql(FINISH, { id: job.id, state: 'FAILED' }, { token: w.nodeToken });
    const d = await t.gql(
      `mutation { deleteTrainJob(id: "${job.id}") { __typename ... on DeletedTrainJob { id } } }`,
      {},
      { token: w.operator },
    );
    expect(d.data?.deleteTrainJob).toEqual({ __typename: 'DeletedTrainJob', id: job.id });
    expect((await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob).toBeNull();
  });
});

describe('refusals of cancel, delete and publish', () => {
  const op = async (name: string, id: string) =>
    (
      await t.gql(
        `mutation { ${name}(id: "${id}") { __typename ... on Error { message } } }`,
        {},
        { token: w.operator },
      )
    ).data?.[name];
  const missing = '00000000-0000-4000-8000-000000000000';

  it('each changes nothing but the audit log', async () => {
    await refusedCleanly('cancelTrainJob', () => op('cancelTrainJob', missing), 'NotFoundError', /no training job/);
    await refusedCleanly('deleteTrainJob', () => op('deleteTrainJob', missing), 'NotFoundError', /no training job/);
    await refusedCleanly('publishTrainJob', () => op('publishTrainJob', missing), 'NotFoundError', /no training job/);
    const { job } = await running({ gguf: false });
    await refusedCleanly(
      'publishTrainJob',
      () => op('publishTrainJob', job.id),
      'ConflictError',
      /has not finished: it is running/,
    );
    await refusedCleanly('deleteTrainJob', () => op('deleteTrainJob', job.id), 'ConflictError', /cancel it first/);
    const up = await fetch(`${base}/api/train/jobs/${job.id}/artifacts/peft`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${w.nodeToken}` },
      body: new Uint8Array(await tarOf(await writeAdapterDir())),
    });
    expect(up.status).toBe(200);
    await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken });
    await refusedCleanly('cancelTrainJob', () => op('cancelTrainJob', job.id), 'ConflictError', /already ended/);
    await refusedCleanly(
      'publishTrainJob',
      () => op('publishTrainJob', job.id),
      'ConflictError',
      /no GGUF adapter, which llama.cpp needs/,
    );
    await t.app.db.prisma.trainJob.update({ where: { id: job.id }, data: { model: 'gone' } });
    await refusedCleanly(
      'publishTrainJob',
      () => op('publishTrainJob', job.id),
      'ConflictError',
      /the model gone is no longer in the catalog/,
    );
  });
});

describe('artifacts and publishing', () => {
  const upload = (id: string, body: Buffer, token = w.nodeToken) =>
    fetch(`${base}/api/train/jobs/${id}/artifacts/peft`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/gzip' },
      body: new Uint8Array(body),
    });

  it('takes the adapter, makes the GGUF, and publishes it into the mirror and the catalog with its lineage', async () => {
    const { job } = await running();
    const tar = await tarOf(await writeAdapterDir());
    const notYet = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(notYet.data?.publishTrainJob).toMatchObject({
      __typename: 'ConflictError',
      message: 'the job has not finished: it is running',
    });
    const up = await upload(job.id, tar);
    expect(up.status).toBe(200);
    const body = await up.json();
    expect(body.artifacts.map((a: { kind: string }) => a.kind).sort()).toEqual(['gguf', 'peft']);
    expect(
      (await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken })).data?.finishTrainJob.state,
    ).toBe('DONE');

    const got = (await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob;
    const gguf = got.artifacts.find((a: { kind: string }) => a.kind === 'gguf');
    const dl = await fetch(`${base}${gguf.url}`, { headers: { authorization: `Bearer ${w.operator}` } });
    expect(dl.headers.get('content-disposition')).toBe(`attachment; filename="${job.name}.gguf"`);
    const bytes = Buffer.from(await dl.arrayBuffer());
    expect(bytes.subarray(0, 4).toString()).toBe('GGUF');
    expect(bytes.length).toBe(gguf.size);

    const pub = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on TrainJobPublished { adapter model source owner note } ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(pub.data?.publishTrainJob).toMatchObject({
      __typename: 'TrainJobPublished',
      adapter: job.name,
      model: 'tiny',
      owner: null,
    });
    expect(pub.data?.publishTrainJob.note).toMatch(
      /^tiny's llama.cpp replicas load \S+ within seconds, without a restart/,
    );
    const served = await fetch(pub.data?.publishTrainJob.source, {
      headers: { authorization: `Bearer ${w.operator}` },
    });
    expect(served.headers.get('etag')).toContain(gguf.sha256);
    const adapter = await t.app.db.prisma.adapter.findUniqueOrThrow({ where: { name: job.name } });
    expect(adapter).toMatchObject({ trainJobId: job.id, artifactSha256: gguf.sha256 });
    expect((await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob.adapter).toBe(job.name);

    const before = await snapshot();
    const twice = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(twice.data?.publishTrainJob).toMatchObject({
      __typename: 'ConflictError',
      message: `${job.name} is already tiny's adapter: train under another name`,
    });
    expect(await snapshot()).toBe(before);
  });

  it('refuses to publish without a GGUF for a llama.cpp model, and when the model has left the catalog', async () => {
    const { job } = await running({ gguf: false });
    expect((await upload(job.id, await tarOf(await writeAdapterDir()))).status).toBe(200);
    await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken });
    const r = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(r.data?.publishTrainJob.message).toMatch(/no GGUF adapter, which llama.cpp needs/);
    await t.app.db.prisma.trainJob.update({ where: { id: job.id }, data: { model: 'gone' } });
    const gone = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(gone.data?.publishTrainJob.message).toMatch(/the model gone is no longer in the catalog/);
  });

  it('publishes the PEFT files into the mirror for a model vLLM serves', async () => {
    for (const [file, body] of [
      ['config.json', '{"model_type":"llama"}'],
      ['model.safetensors', 'weights'],
    ]) {
      const put = await fetch(`${base}/mirror/tiny-hf/v1/${file}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${w.operator}` },
        body,
      });
      expect(put.status).toBe(201);
    }
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "tiny-hf", version: "v1", mode: STOPPED) { __typename ... on Error { message } } }',
      {},
      { token: w.operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const { job } = await running({ model: 'tiny-hf' });
    expect(job.gguf).toBe(false);
    expect((await upload(job.id, await tarOf(await writeAdapterDir()))).status).toBe(200);
    await t.gql(FINISH, { id: job.id, state: 'DONE' }, { token: w.nodeToken });
    const pub = await t.gql(
      `mutation { publishTrainJob(id: "${job.id}") { __typename ... on TrainJobPublished { source note } ... on Error { message } } }`,
      {},
      { token: w.operator },
    );
    expect(pub.data?.publishTrainJob.__typename).toBe('TrainJobPublished');
    expect(pub.data?.publishTrainJob.source).toBe(`${base}/mirror/${job.name}/job-${job.id.slice(0, 8)}/`);
    expect(pub.data?.publishTrainJob.note).toMatch(
      /vLLM replicas load \S+ without a restart: .*\/v1\/load_lora_adapter/,
    );
    const files = await t.app.db.prisma.mirrorFile.findMany({ where: { model: job.name }, orderBy: { file: 'asc' } });
    expect(files.map((f) => [f.file, f.state])).toEqual([
      ['adapter_config.json', 'PRESENT'],
      ['adapter_model.safetensors', 'PRESENT'],
    ]);
  });

  it('fails the job when the upload is not a PEFT adapter, saying why', async () => {
    const { job } = await running();
    const up = await upload(job.id, Buffer.from('this is not a tar'));
    expect(up.status).toBe(422);
    const got = (await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob;
    expect(got.state).toBe('FAILED');
    expect(got.jobMessage).toMatch(/the adapter was refused/);
    expect(got.artifacts).toEqual([]);
  });

  it('fails the job when the adapter cannot become a llama.cpp GGUF (DoRA), keeping the PEFT files', async () => {
    const { job } = await running();
    const up = await upload(job.id, await tarOf(await writeAdapterDir({ config: { use_dora: true } })));
    expect(up.status).toBe(422);
    const got = (await t.gql(GET, { id: job.id }, { token: w.operator })).data?.trainJob;
    expect(got.state).toBe('FAILED');
    expect(got.jobMessage).toMatch(/cannot be made into a llama.cpp GGUF: .*DoRA/);
    expect(got.artifacts.map((a: { kind: string }) => a.kind)).toEqual(['peft']);
  });

  it('refuses an upload from a node that does not run the job', async () => {
    const job = await create(valid());
    const up = await upload(job.id, await tarOf(await writeAdapterDir()));
    expect(up.status).toBe(409);
  });
});

/** Runs a call that must be refused: the answer's type, and nothing changed but one REFUSED audit event. */
async function refusedCleanly(
  action: string,
  call: () => Promise<{ __typename: string; message?: string }>,
  type: string,
  message: RegExp,
) {
  const before = await snapshot();
  const audits = await t.app.db.prisma.auditEvent.count({ where: { action, outcome: 'REFUSED' } });
  const r = await call();
  expect(r.__typename).toBe(type);
  expect(r.message).toMatch(message);
  expect(await snapshot()).toBe(before);
  expect(await t.app.db.prisma.auditEvent.count({ where: { action, outcome: 'REFUSED' } })).toBe(audits + 1);
}

async function until(check: () => boolean, ms = 5000) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 20));
  }
}
