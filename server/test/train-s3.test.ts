import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { DeleteObjectCommand, ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { App } from '../src/app.js';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { BASE_REPO, PAIRS, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// Training on a mirror kept in a bucket (HANGAR_MIRROR_STORE=s3://…, s3rver standing in for S3: see
// fixtures/s3.ts), with nothing shared between the server replicas but PostgreSQL and the bucket: a real agent
// runs the stand-in trainer (fixtures/stand-in-trainer.mjs, train_lora.py's protocol without a GPU), the server
// makes the llama.cpp GGUF adapter from the base model's header in the bucket, and a SECOND server with its own
// data dir serves the job's pairs and artifacts, counts tokens, publishes the adapter (its fit checked against the
// base GGUF read from the bucket) and serves it on /mirror with Range.

const TRAINER = new URL('./fixtures/stand-in-trainer.mjs', import.meta.url).pathname;

let s3: S3Fixture;
let sdk: S3Client;
let hub: FakeHub;
let t: TestApp;
let base: string;
let w: TrainingWorld;
let agent: Agent | undefined;
let replica: App | undefined;
const dirs: string[] = [];

const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

async function objects(): Promise<string[]> {
  const r = await sdk.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: 'mirror/' }));
  return (r.Contents ?? []).map((o) => o.Key as string);
}

/** Every file under a data dir's `sub`, as paths relative to it. */
async function filesUnder(dir: string): Promise<string[]> {
  const entries = await fs.readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
  return entries.filter((e) => e.isFile()).map((e) => path.relative(dir, path.join(e.parentPath, e.name)));
}

async function until<T>(check: () => Promise<T | undefined | false>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  hub = await startFakeHub();
  t = await startTestApp({
    HANGAR_HUB_URL: hub.url,
    HANGAR_MIRROR_STORE: `s3://${s3.bucket}/mirror`,
    HANGAR_S3_FORCE_PATH_STYLE: 'true',
  });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
}, 60_000);
afterAll(async () => {
  await agent?.stop();
  await replica?.stop();
  await t?.close();
  await hub?.close();
  await s3?.close();
  sdk?.destroy();
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

describe('training on a mirror in a bucket (HANGAR_MIRROR_STORE=s3://…)', () => {
  it('trains, makes the GGUF adapter, and a second server with its own data dir serves, publishes and serves the adapter', async () => {
    const agentDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-s3-agent-'));
    dirs.push(agentDir);
    process.env.HANGAR_STAND_IN_STEP_MS = '20';
    agent = createAgent(
      loadAgentConfig({
        HANGAR_URL: base,
        HANGAR_NODE_TOKEN: w.nodeToken,
        HANGAR_AGENT_DIR: agentDir,
        HANGAR_AGENT_GPUS: JSON.stringify([{ name: 'H100', totalMiB: 81559, freeMiB: 20000 }]),
        HANGAR_AGENT_HEARTBEAT_MS: '500',
        HANGAR_TRAINER: `${process.execPath} ${TRAINER}`,
        HANGAR_STAND_IN_STEP_MS: '20',
        HANGAR_AGENT_THREADS: '1',
        HANGAR_LOG_LEVEL: 'silent',
      }),
      { log: createLogger('silent'), runtime: () => Promise.reject(new Error('llama.cpp is not needed to train')) },
    );
    await agent.start();
    const name = `bucketed-${Math.random().toString(36).slice(2, 8)}`;
    const created = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name,
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 4000,
          public: true,
          data: PAIRS,
          evalShare: 0,
          params: { batch: 4, epochs: 1, rank: 4 },
        },
      },
      { token: w.operator },
    );
    expect(created.data?.createTrainJob.__typename, JSON.stringify(created)).toBe('TrainJob');
    const id = created.data?.createTrainJob.id as string;
    const job = await until(async () => {
      const j = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });
      return j.state === 'DONE' || j.state === 'FAILED' ? j : undefined;
    });
    expect(job.state, job.message ?? '').toBe('DONE');
    const arts = await t.app.db.prisma.trainArtifact.findMany({ where: { jobId: id }, orderBy: { kind: 'asc' } });
    expect(arts.map((a) => a.kind)).toEqual(['peft', 'gguf']);
    const gguf = arts.find((a) => a.kind === 'gguf');
    const peft = arts.find((a) => a.kind === 'peft');
    const events = await t.app.db.prisma.trainEvent.findMany({ where: { jobId: id } });
    const said = events.map((e) => e.message).join('\n');
    expect(said).toMatch(/GGUF adapter made/);
    // The agent had base and adapter answer the general questions with llama.cpp on the CPU: the base GGUF came
    // through /mirror from the bucket (the size the evaluation spec gave it read from the row, not the data dir).
    expect(said).toMatch(/on the general questions: (BETTER|WORSE|NO_CLEAR_DIFFERENCE)/);

    // The pairs and what the job made are in the bucket under their sha256; under the data dir, at most the
    // verified local copies of the cache.
    const keys = await objects();
    for (const sha of [job.dataSha256, gguf?.sha256, peft?.sha256])
      expect(keys).toContain(`mirror/blobs/sha256/${sha?.slice(0, 2)}/${sha}`);
    expect(await filesUnder(path.join(t.dataDir, 'train'))).toEqual([]);

    // A second server: its own data dir, the same PostgreSQL and bucket. As if it ran on another machine, nothing
    // of the first one's data dir is left to read by path (both run on this one).
    await fs.rm(path.join(t.dataDir, 'cache'), { recursive: true, force: true });
    const other = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-s3-b-'));
    dirs.push(other);
    replica = await t.replica({ HANGAR_DATA_DIR: other });
    const second = await replica.start();
    const get = (url: string, headers: Record<string, string> = {}) =>
      fetch(`${second}${url}`, { headers: { authorization: `Bearer ${w.operator}`, ...headers } });

    const data = await get(`/api/train/jobs/${id}/data`);
    expect(data.status).toBe(200);
    expect(await data.text()).toBe(PAIRS);
    for (const a of [gguf, peft]) {
      const r = await get(`/api/train/jobs/${id}/artifacts/${a?.kind}`);
      expect(r.status, a?.kind).toBe(200);
      expect(sha256(new Uint8Array(await r.arrayBuffer())), a?.kind).toBe(a?.sha256);
    }

    // Token counts by the base model's tokenizer, on the server that never held the model's file.
    const counted = await fetch(`${second}/api/train/data?model=tiny`, {
      method: 'POST',
      headers: { authorization: `Bearer ${w.operator}`, 'content-type': 'application/x-ndjson' },
      body: PAIRS,
    });
    const report = (await counted.json()) as { tokens?: { pair: { max: number } }; tokensNote: string | null };
    expect(report.tokensNote).toBeNull();
    expect(report.tokens?.pair.max).toBeGreaterThan(0);

    // Published from the second server: the fit is checked against the base GGUF in the bucket.
    const published = await fetch(`${second}/graphql`, {
      method: 'POST',
      headers: { authorization: `Bearer ${w.operator}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        query:
          'mutation($id: ID!) { publishTrainJob(id: $id) { __typename ... on TrainJobPublished { adapter source } ... on Error { message } } }',
        variables: { id },
      }),
    });
    const answer = ((await published.json()) as any).data?.publishTrainJob;
    expect(answer?.__typename, JSON.stringify(answer)).toBe('TrainJobPublished');
    const file = `/mirror/${name}/job-${id.slice(0, 8)}/${name}.gguf`;
    expect(answer.source).toBe(`${second}${file}`);

    // Served by either server from the bucket, with Range.
    const size = Number(gguf?.size);
    for (const server of [second, base]) {
      const part = await fetch(`${server}${file}`, {
        headers: { authorization: `Bearer ${w.operator}`, range: `bytes=4-${size - 1}` },
      });
      expect(part.status).toBe(206);
      const whole = Buffer.concat([Buffer.from('GGUF'), Buffer.from(await part.arrayBuffer())]);
      expect(sha256(whole)).toBe(gguf?.sha256);
    }
    expect(await filesUnder(path.join(other, 'train'))).toEqual([]);
    expect(await filesUnder(path.join(other, 'mirror'))).toEqual([]);

    // Deleting the job takes its pairs and PEFT tar out of the bucket; the published adapter's bytes stay, as its
    // mirror version names them.
    const deleted = await t.gql(
      'mutation($id: ID!) { deleteTrainJob(id: $id) { __typename ... on Error { message } } }',
      { id },
      { token: w.operator },
    );
    expect(deleted.data?.deleteTrainJob.__typename, JSON.stringify(deleted)).toBe('DeletedTrainJob');
    const left = await objects();
    const key = (sha?: string) => `mirror/blobs/sha256/${sha?.slice(0, 2)}/${sha}`;
    expect(left).not.toContain(key(job.dataSha256));
    expect(left).not.toContain(key(peft?.sha256));
    expect(left).toContain(key(gguf?.sha256));
    expect((await get(file)).status).toBe(200);
    await agent.stop();
    agent = undefined;
  }, 120_000);

  it('puts pairs kept under the data dir before the mirror moved into the bucket into it at their first read', async () => {
    const pairs = Array.from({ length: 6 }, (_, i) => JSON.stringify({ q: `old ${i}?`, a: `kept ${i}` })).join('\n');
    const created = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name: `before-${Math.random().toString(36).slice(2, 8)}`,
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 4000,
          public: true,
          data: pairs,
          evalShare: 0,
        },
      },
      { token: w.operator },
    );
    const id = created.data?.createTrainJob.id as string;
    expect(id, JSON.stringify(created)).toBeTruthy();
    const job = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });
    // As a `file` mirror left it (hangar mirror migrate moves the mirror's files, not training's): under the data
    // dir, not in the bucket.
    const key = `mirror/blobs/sha256/${job.dataSha256.slice(0, 2)}/${job.dataSha256}`;
    await sdk.send(new DeleteObjectCommand({ Bucket: s3.bucket, Key: key }));
    await fs.mkdir(path.dirname(job.dataPath), { recursive: true });
    await fs.writeFile(job.dataPath, pairs);
    expect(await objects()).not.toContain(key);

    const r = await fetch(`${base}/api/train/jobs/${id}/data`, { headers: { authorization: `Bearer ${w.operator}` } });
    expect(r.status).toBe(200);
    expect(await r.text()).toBe(pairs);
    expect(await objects()).toContain(key);
    await t.gql(`mutation { cancelTrainJob(id: "${id}") { __typename } }`, {}, { token: w.operator });
  }, 60_000);
});
