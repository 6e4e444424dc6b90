import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { downloadFile } from '@huggingface/hub';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { type FakeFile, type FakeHub, fileSha256, startFakeHub } from './fixtures/fake-hub.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// The mirror on an S3-compatible bucket (HANGAR_MIRROR_STORE=s3://…), end to end: a server started against
// s3rver (test/fixtures/s3.ts: a real S3 protocol server on loopback, reached through the AWS SDK and its
// standard variables) fetches a repository's files from the stand-in Hub, keeps them in the bucket by sha256 and
// nothing under its data dir, serves them on /mirror with Range and on /hf to @huggingface/hub's own client, and
// deletes an object once no version names its bytes.

const REPO = 'acme/bucketed';
const COMMIT = 'b0cce7'.repeat(6) + 'b0cc';
const FILES: FakeFile[] = [
  { path: 'config.json', head: Buffer.from(JSON.stringify({ model_type: 'llama' })), size: 0 },
  // Past @huggingface/hub's 1 MB in-memory threshold, so it reads it with Range requests.
  { path: 'model.safetensors', head: bytes(1_300_000, 11), size: 0, lfs: true },
].map((f) => ({ ...f, size: f.head.length }));
// A real GGUF (llama's vocabulary, a header llama.cpp reads), fetched into the bucket to be planned and served.
const GGUF_REPO = 'acme/bucketed-gguf';
const GGUF: FakeFile = (() => {
  const head = readFileSync(
    new URL('../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
  );
  return { path: 'model.gguf', head, size: head.length, lfs: true };
})();
const sha = (p: string) => fileSha256(FILES.find((f) => f.path === p) as FakeFile);

let s3: S3Fixture;
let hub: FakeHub;
let t: TestApp;
let base: string;
let token: string;
let sdk: S3Client;
let up: Upstream;

async function objects(): Promise<string[]> {
  const r = await sdk.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: 'mirror/' }));
  return (r.Contents ?? []).map((o) => o.Key as string).sort();
}

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await fs.readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
  return entries.filter((e) => e.isFile()).map((e) => path.join(e.parentPath, e.name));
}

async function fetched(model: string, version: string, files: FakeFile[], repo = REPO) {
  const r = await t.gql(
    'mutation($m: String!, $v: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: $m, version: $v, sources: $s) { __typename ... on Error { message } } }',
    {
      m: model,
      v: version,
      s: files.map((f) => ({ url: `${hub.url}/${repo}/resolve/${COMMIT}/${f.path}`, file: f.path })),
    },
    { token },
  );
  expect(r.data?.fetchToMirror.__typename, JSON.stringify(r.data)).toBe('FetchStarted');
  const end = Date.now() + 60_000;
  for (;;) {
    const rows = await t.app.db.prisma.mirrorFile.findMany({ where: { model, version } });
    const failed = rows.find((r) => r.state === 'FAILED');
    if (failed) throw new Error(`${failed.file} failed: ${failed.error}`);
    if (rows.length === files.length && rows.every((r) => r.state === 'PRESENT')) return rows;
    if (Date.now() > end) throw new Error(`${model}/${version} did not arrive: ${rows.map((r) => r.state)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  up = await startUpstream();
  hub = await startFakeHub();
  hub.repos.set(REPO, { id: REPO, sha: COMMIT, files: FILES });
  hub.repos.set(GGUF_REPO, { id: GGUF_REPO, sha: COMMIT, files: [GGUF] });
  t = await startTestApp({
    HANGAR_HUB_URL: hub.url,
    HANGAR_MIRROR_STORE: `s3://${s3.bucket}/mirror`,
    HANGAR_S3_FORCE_PATH_STYLE: 'true',
  });
  base = await t.app.start();
  token = await t.token('OPERATOR', 'bucket-reader');
}, 60_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
  await up?.close();
  await s3?.close();
  sdk?.destroy();
});

describe('the mirror on an S3 bucket (HANGAR_MIRROR_STORE=s3://…)', () => {
  it('fetches into the bucket by sha256, serves /mirror with Range and /hf, and deletes objects no version holds', async () => {
    const rows = await fetched('bucketed', 'v1', FILES);
    for (const f of FILES) expect(rows.find((r) => r.file === f.path)?.actualSha256, f.path).toBe(fileSha256(f));
    // In the bucket under the sha256, with the storage id beside them; nothing of theirs under the data dir.
    const keys = await objects();
    for (const f of FILES) expect(keys).toContain(`mirror/blobs/sha256/${sha(f.path).slice(0, 2)}/${sha(f.path)}`);
    expect(await filesUnder(path.join(t.dataDir, 'mirror'))).toEqual([]);
    expect(await t.app.db.prisma.mirrorUpload.count()).toBe(0);

    // /mirror: the whole file, a byte range of it, and its ETag (the sha256).
    const url = `${base}/mirror/bucketed/v1/model.safetensors`;
    const big = FILES[1] as FakeFile;
    const whole = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
    expect(whole.status).toBe(200);
    expect(whole.headers.get('etag')).toBe(`"${sha('model.safetensors')}"`);
    const body = Buffer.from(await whole.arrayBuffer());
    expect(createHash('sha256').update(body).digest('hex')).toBe(sha('model.safetensors'));
    const part = await fetch(url, { headers: { authorization: `Bearer ${token}`, range: 'bytes=1000-1999' } });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 1000-1999/${big.size}`);
    expect(Buffer.from(await part.arrayBuffer())).toEqual(big.head.subarray(1000, 2000));

    // /hf, read by the Hub's own client (the large file in ranges).
    for (const f of FILES) {
      const blob = await downloadFile({ repo: REPO, path: f.path, hubUrl: `${base}/hf`, accessToken: `hf_${token}` });
      const got = Buffer.from(await (blob as Blob).arrayBuffer());
      expect(createHash('sha256').update(got).digest('hex'), f.path).toBe(fileSha256(f));
    }

    // A second server with its own data dir, on the same database and bucket, serves the same file; with
    // HANGAR_S3_PRESIGN=on it sends a node (and only a node) to a presigned URL on the bucket.
    const other = await fs.mkdtemp(path.join(path.dirname(t.dataDir), 'hangar-data-b-'));
    const replica = await t.replica({ HANGAR_DATA_DIR: other, HANGAR_S3_PRESIGN: 'on' });
    const second = await replica.start();
    const fromReplica = await fetch(`${second}/mirror/bucketed/v1/model.safetensors`, {
      headers: { authorization: `Bearer ${token}`, range: 'bytes=5-9' },
    });
    expect(fromReplica.status).toBe(206);
    expect(Buffer.from(await fromReplica.arrayBuffer())).toEqual(big.head.subarray(5, 10));
    expect(await filesUnder(path.join(other, 'mirror'))).toEqual([]);
    const admin = await t.token('ADMIN', 'bucket-admin');
    const nodeToken = (
      await t.gql('mutation { createNode(name: "gpu-s3") { ... on CreatedNode { token } } }', {}, { token: admin })
    ).data?.createNode.token as string;
    const sent = await fetch(`${second}/mirror/bucketed/v1/model.safetensors`, {
      headers: { authorization: `Bearer ${nodeToken}` },
      redirect: 'manual',
    });
    expect(sent.status).toBe(302);
    expect(sent.headers.get('cache-control')).toBe('private, no-store');
    const location = sent.headers.get('location') as string;
    expect(location.startsWith(s3.endpoint)).toBe(true);
    const fromBucket = Buffer.from(await (await fetch(location)).arrayBuffer());
    expect(createHash('sha256').update(fromBucket).digest('hex')).toBe(sha('model.safetensors'));
    await fs.rm(other, { recursive: true, force: true });

    // The same bytes in a second version: one object; removing one version keeps it, removing the last deletes it.
    await fetched('bucketed', 'v2', [big]);
    const blob = `mirror/blobs/sha256/${sha('model.safetensors').slice(0, 2)}/${sha('model.safetensors')}`;
    const remove = (version: string) =>
      t.gql(
        'mutation($m: String!, $v: String!) { removeMirrorVersion(model: $m, version: $v) { __typename ... on Error { message } } }',
        { m: 'bucketed', v: version },
        { token },
      );
    expect((await remove('v1')).data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
    expect(await objects()).toContain(blob);
    expect(
      (await fetch(`${base}/mirror/bucketed/v2/model.safetensors`, { headers: { authorization: `Bearer ${token}` } }))
        .status,
    ).toBe(200);
    expect((await remove('v2')).data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
    const left = await objects();
    expect(left).not.toContain(blob);
    expect(left.filter((k) => k.includes('/blobs/'))).toEqual([]);
    expect(await t.app.db.prisma.mirrorUpload.count()).toBe(0);
    await replica.stop();
  }, 120_000);

  it('continues a fetch from the last part in the bucket after the server restarts, not from zero', async () => {
    // Two parts and a bit (the store's parts are 8 MiB): the upstream goes silent after the first part and a half.
    const PART = 8 * 1024 * 1024;
    const body = bytes(2 * PART + 4096, 5);
    const want = createHash('sha256').update(body).digest('hex');
    up.files.set('big.bin', { body, fault: { kind: 'stall', afterBytes: PART + PART / 2, times: 1 } });
    const r = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "resumed", version: "v1", sources: $s) { __typename ... on Error { message } } }',
      { s: [{ url: up.url('big.bin'), file: 'big.bin', sha256: want }] },
      { token },
    );
    expect(r.data?.fetchToMirror.__typename, JSON.stringify(r.data)).toBe('FetchStarted');
    const end = Date.now() + 60_000;
    const id = (await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'resumed' } })).id;
    while (Number((await t.app.db.prisma.mirrorUpload.findUnique({ where: { id } }))?.bytesDone ?? 0) < PART) {
      if (Date.now() > end) {
        const f = await t.app.db.prisma.mirrorFile.findFirst({ where: { model: 'resumed' } });
        throw new Error(`the first part was never checkpointed: ${f?.state} ${f?.bytesDone} ${f?.error}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    await t.restart();
    base = await t.app.start();
    const row = await (async () => {
      for (;;) {
        const f = await t.app.db.prisma.mirrorFile.findFirst({ where: { model: 'resumed' } });
        if (f?.state === 'FAILED') throw new Error(f.error ?? 'failed');
        if (f?.state === 'PRESENT') return f;
        if (Date.now() > end) throw new Error(`not present: ${f?.state}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    expect(row.actualSha256).toBe(want);
    const asked = up.requests.filter((q) => q.name === 'big.bin').map((q) => q.range ?? 'all');
    expect(asked).toEqual(['all', `bytes=${PART}-`]);
    expect(await t.app.db.prisma.mirrorUpload.count()).toBe(0);
    expect(await objects()).toContain(`mirror/blobs/sha256/${want.slice(0, 2)}/${want}`);
    const got = await fetch(`${base}/mirror/resumed/v1/big.bin`, {
      headers: { authorization: `Bearer ${token}`, range: `bytes=${2 * PART}-` },
    });
    expect(Buffer.from(await got.arrayBuffer())).toEqual(body.subarray(2 * PART));
  }, 120_000);

  it('drops the upload and its checkpoint of a fetch cancelled half-way', async () => {
    const PART = 8 * 1024 * 1024;
    // Silent after a part and a half: the first part is checkpointed, the second never completes.
    up.files.set('cut.bin', { body: bytes(2 * PART, 9), fault: { kind: 'stall', afterBytes: PART + PART / 2 } });
    const r = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "cut", version: "v1", sources: $s) { __typename ... on Error { message } } }',
      { s: [{ url: up.url('cut.bin'), file: 'cut.bin' }] },
      { token },
    );
    expect(r.data?.fetchToMirror.__typename, JSON.stringify(r.data)).toBe('FetchStarted');
    const id = (await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'cut' } })).id;
    const end = Date.now() + 60_000;
    while (Number((await t.app.db.prisma.mirrorUpload.findUnique({ where: { id } }))?.bytesDone ?? 0) < PART) {
      if (Date.now() > end) {
        const f = await t.app.db.prisma.mirrorFile.findUnique({ where: { id } });
        throw new Error(`the first part was never checkpointed: ${f?.state} ${f?.bytesDone} ${f?.error}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    const c = await t.gql(
      'mutation { cancelMirrorFetch(model: "cut", version: "v1") { __typename ... on Error { message } } }',
      {},
      { token },
    );
    expect(c.data?.cancelMirrorFetch.__typename, JSON.stringify(c.data)).toBe('MirrorVersion');
    while (await t.app.db.prisma.mirrorUpload.findUnique({ where: { id } })) {
      if (Date.now() > end) throw new Error('the cancelled upload was kept');
      await new Promise((r) => setTimeout(r, 50));
    }
    expect((await t.app.db.prisma.mirrorFile.findUniqueOrThrow({ where: { id } })).state).toBe('CANCELLED');
  }, 120_000);

  it('plans and serves a GGUF fetched into the bucket from its header read in the bucket, not the data dir', async () => {
    const [row] = await fetched('bucket-gguf', 'v1', [GGUF], GGUF_REPO);
    expect(row?.actualSha256).toBe(fileSha256(GGUF));
    expect(await objects()).toContain(`mirror/blobs/sha256/${fileSha256(GGUF).slice(0, 2)}/${fileSha256(GGUF)}`);
    // A row verified before kinds were recorded: its kind is read again, from the blob.
    await t.app.db.prisma.mirrorFile.update({ where: { id: row?.id }, data: { kind: null } });
    const plan = await t.gql(
      '{ servePlan(model: "bucket-gguf", version: "v1") { __typename ... on ServePlan { engine architecture source } ... on Error { message } } }',
      {},
      { token },
    );
    expect(plan.data?.servePlan, JSON.stringify(plan)).toMatchObject({
      __typename: 'ServePlan',
      engine: 'llamacpp',
      architecture: 'llama',
    });
    expect(plan.data?.servePlan.source).toMatch(/\/mirror\/bucket-gguf\/v1\/model\.gguf$/);
    expect((await t.app.db.prisma.mirrorFile.findUnique({ where: { id: row?.id } }))?.kind).toBe('MODEL');
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "bucket-gguf", version: "v1") { __typename ... on ServePlaced { model { name engine source } } ... on Error { message } } }',
      {},
      { token },
    );
    expect(served.data?.serveMirrorVersion, JSON.stringify(served)).toMatchObject({
      __typename: 'ServePlaced',
      model: { name: 'bucket-gguf', engine: 'llamacpp' },
    });
  });

  it("reads a model's config.json from the bucket, as training's adapter check does", async () => {
    const config = FILES.find((f) => f.path === 'config.json') as FakeFile;
    const [row] = await fetched('bucket-config', 'v1', [config]);
    // What train/artifacts.ts's PEFT check reads (the vLLM model's hidden size), through the mirror.
    expect(JSON.parse(await t.app.services.mirror.readText(row as NonNullable<typeof row>))).toEqual({
      model_type: 'llama',
    });
  });

  it('refuses a store, a presign or a path-style setting it does not know, naming the variable', () => {
    const base = { HANGAR_DATA_DIR: '/nonexistent' };
    expect(() => loadConfig({ ...base, HANGAR_MIRROR_STORE: 'ftp://bucket' })).toThrow(
      /HANGAR_MIRROR_STORE="ftp:\/\/bucket" is not accepted: .*'file' .*'s3:\/\/bucket\/prefix'/,
    );
    expect(() => loadConfig({ ...base, HANGAR_S3_PRESIGN: 'yes' })).toThrow(/HANGAR_S3_PRESIGN="yes" .*off or on/);
    expect(() => loadConfig({ ...base, HANGAR_S3_FORCE_PATH_STYLE: 'maybe' })).toThrow(/HANGAR_S3_FORCE_PATH_STYLE/);
    expect(loadConfig({ ...base, HANGAR_MIRROR_STORE: 's3://my-bucket/pre/fix/' }).mirrorStore).toEqual({
      kind: 's3',
      bucket: 'my-bucket',
      prefix: 'pre/fix/',
    });
    expect(loadConfig(base).mirrorStore).toEqual({ kind: 'file' });
  });
});
