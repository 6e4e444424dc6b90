import { modelHeader } from '@hangar/common/test/fixtures/gguf-writer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import {
  BASE_REPO,
  PAIRS,
  type TrainingWorld,
  tarOf,
  trainingWorld,
  writeAdapterDir,
} from '../../test/fixtures/training.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// Publishing checks the adapter against the model's file as the catalog has it now, before anything is saved:
// a model served again from other weights since the job trained would fail the adapter on every replica.

let t: TestApp;
let hub: FakeHub;
let base: string;
let w: TrainingWorld;

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
  // Other weights the catalog's "tiny" may come to point at: twice as wide, and another architecture.
  for (const [where, arch, embd] of [
    ['tiny-wide/v1/wide.gguf', 'llama', 128],
    ['tiny-qwen/v1/qwen.gguf', 'qwen2', 64],
  ] as const) {
    const put = await fetch(`${base}/mirror/${where}`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${w.operator}` },
      body: new Uint8Array(modelHeader({ arch, embd, layers: 2, heads: 4, kvHeads: 4 }).header),
    });
    expect(put.status).toBe(201);
  }
});
afterAll(async () => {
  await t.close();
  await hub.close();
});

const PUBLISH = `mutation($id: ID!) { publishTrainJob(id: $id) { __typename
  ... on TrainJobPublished { adapter model note liveWithoutRestart } ... on Error { message } } }`;

/** A finished job of the tiny model, with its PEFT upload and the GGUF adapter the server made from it. */
async function doneJob(model = 'tiny') {
  const name = `fit-${Math.random().toString(36).slice(2, 8)}`;
  const created = await t.gql(
    `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
    {
      i: {
        name,
        model,
        baseRepo: BASE_REPO,
        node: 'gpu-1',
        gpuMiB: 8000,
        public: true,
        data: PAIRS,
        params: { rank: 4, epochs: 1, batch: 4 },
      },
    },
    { token: w.operator },
  );
  const id = created.data?.createTrainJob.id as string;
  expect(id).toBeTruthy();
  const claim = await t.gql(
    'mutation($id: ID!) { claimTrainJob(id: $id) { __typename } }',
    { id },
    { token: w.nodeToken },
  );
  expect(claim.data?.claimTrainJob.__typename).toBe('TrainClaim');
  const up = await fetch(`${base}/api/train/jobs/${id}/artifacts/peft`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${w.nodeToken}`, 'content-type': 'application/gzip' },
    body: new Uint8Array(await tarOf(await writeAdapterDir())),
  });
  expect(up.status).toBe(200);
  const done = await t.gql(
    'mutation($id: ID!) { finishTrainJob(id: $id, state: DONE) { __typename } }',
    { id },
    { token: w.nodeToken },
  );
  expect(done.data?.finishTrainJob.__typename).toBe('TrainJob');
  return { id, name };
}

async function snapshot() {
  const p = t.app.db.prisma;
  return JSON.stringify({
    adapters: await p.adapter.findMany({ orderBy: { name: 'asc' } }),
    files: await p.mirrorFile.findMany({ orderBy: { id: 'asc' }, select: { id: true, state: true } }),
    events: await p.trainEvent.count(),
    models: await p.catalogModel.findMany({ orderBy: { name: 'asc' }, select: { name: true, source: true } }),
  });
}

const pointAt = (name: string, source: string) =>
  t.app.db.prisma.catalogModel.update({ where: { name }, data: { source } });
const pointTinyAt = (source: string) => pointAt('tiny', source);

describe('publishing an adapter', () => {
  it('refuses an adapter whose dimensions or architecture do not fit the model, changing nothing', async () => {
    const job = await doneJob();
    await pointTinyAt(`${base}/mirror/tiny-wide/v1/wide.gguf`);
    const before = await snapshot();
    const wide = await t.gql(PUBLISH, { id: job.id }, { token: w.operator });
    expect(wide.data?.publishTrainJob).toEqual({
      __typename: 'ConflictError',
      message:
        "not published: blk.0.attn_q.weight: the adapter was made for 64×64 and tiny's file has 128×128 (its embedding length is 128): it was trained on a model of other dimensions. Nothing was changed",
    });
    expect(await snapshot()).toBe(before);
    expect((await fetch(`${base}/mirror/${job.name}/job-${job.id.slice(0, 8)}/`)).status).not.toBe(200);

    await pointTinyAt(`${base}/mirror/tiny-qwen/v1/qwen.gguf`);
    const qwen = await t.gql(PUBLISH, { id: job.id }, { token: w.operator });
    expect(qwen.data?.publishTrainJob.message).toBe(
      "not published: the adapter is for llama and tiny's file is qwen2: llama.cpp loads an adapter only on its own architecture. Train it again on tiny's weights. Nothing was changed",
    );

    // On the weights it was trained on, it fits, and the answer says it is live without a restart.
    await pointTinyAt(`${base}/mirror/tiny/v1/tiny.gguf`);
    const fits = await t.gql(PUBLISH, { id: job.id }, { token: w.operator });
    expect(fits.data?.publishTrainJob).toMatchObject({
      __typename: 'TrainJobPublished',
      adapter: job.name,
      model: 'tiny',
      liveWithoutRestart: true,
    });
  });

  it('refuses a PEFT adapter whose hidden size is not the vLLM model config.json says, changing nothing', async () => {
    // Two vLLM versions of "the same" model: the tiny one it trains on (64 wide), and one twice as wide.
    for (const [version, hidden] of [
      ['v64', 64],
      ['v128', 128],
    ] as const) {
      for (const [file, body] of [
        ['config.json', JSON.stringify({ model_type: 'llama', hidden_size: hidden })],
        ['model.safetensors', 'weights'],
      ]) {
        const put = await fetch(`${base}/mirror/tiny-vllm/${version}/${file}`, {
          method: 'PUT',
          headers: { authorization: `Bearer ${w.operator}` },
          body,
        });
        expect(put.status).toBe(201);
      }
    }
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "tiny-vllm", version: "v128", mode: STOPPED) { __typename ... on Error { message } } }',
      {},
      { token: w.operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const job = await doneJob('tiny-vllm');
    const before = await snapshot();
    const wide = await t.gql(PUBLISH, { id: job.id }, { token: w.operator });
    expect(wide.data?.publishTrainJob).toEqual({
      __typename: 'ConflictError',
      message:
        "not published: base_model.model.model.layers.0.self_attn.q_proj: the adapter was made for a hidden size of 64 and tiny-vllm's config.json says 128: it was trained on a model of other dimensions. Nothing was changed",
    });
    expect(await snapshot()).toBe(before);
    await pointAt('tiny-vllm', `${base}/mirror/tiny-vllm/v64/`);
    const fits = await t.gql(PUBLISH, { id: job.id }, { token: w.operator });
    expect(fits.data?.publishTrainJob).toMatchObject({ __typename: 'TrainJobPublished', liveWithoutRestart: true });
  });
});
