import { createHash } from 'node:crypto';
import { ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { blobClaimHooks } from '../src/mirror/blob-claims.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// The operator's controls on a mirror kept in a bucket (HANGAR_MIRROR_STORE=s3://…, s3rver on loopback through
// the AWS SDK), and a removal racing a landing of the same bytes. The upstream is the fault upstream (it stands in
// for the Hub's file server: Range, ETag = sha256, and the faults asked for).

const PART = 8 * 1024 * 1024; // the bucket's part size
let s3: S3Fixture;
let t: TestApp;
let base: string;
let token: string;
let sdk: S3Client;
let up: Upstream;

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const blobKey = (s: string) => `mirror/blobs/sha256/${s.slice(0, 2)}/${s}`;
async function objects(): Promise<string[]> {
  const r = await sdk.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: 'mirror/' }));
  return (r.Contents ?? []).map((o) => o.Key as string);
}
async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
const gql = (query: string, variables: Record<string, unknown> = {}) => t.gql(query, variables, { token });
const fetchTo = (model: string, file: string, url: string, sha256: string) =>
  gql(
    'mutation($m: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: $m, version: "v1", sources: $s) { __typename ... on Error { message } } }',
    { m: model, s: [{ url, file, sha256 }] },
  );
const control = (op: string, model: string) =>
  gql(`mutation($m: String!) { ${op}(model: $m, version: "v1") { __typename ... on Error { message } } }`, {
    m: model,
  });
const row = (model: string) => t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model } });

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  up = await startUpstream();
  t = await startTestApp({
    HANGAR_MIRROR_STORE: `s3://${s3.bucket}/mirror`,
    HANGAR_S3_FORCE_PATH_STYLE: 'true',
    // Two tries in a row without a byte fail the file: the retry test's upstream ends early every time.
    HANGAR_MIRROR_ATTEMPTS: '2',
  });
  base = await t.app.start();
  token = await t.token('OPERATOR', 'bucket-operator');
}, 60_000);
afterAll(async () => {
  await t?.close();
  await up?.close();
  await s3?.close();
  sdk?.destroy();
});

describe('a mirror in a bucket: pause, resume, retry, and a removal racing a landing', () => {
  it('pauses a download keeping its checkpoint, and resumes it from the last part with If-Range', async () => {
    // Slow enough (about 5 MB/s) that the pause comes long before the last byte, even on a loaded machine.
    const body = bytes(3 * PART + 4096, 41);
    const want = sha(body);
    up.files.set('paused.bin', { body, fault: { kind: 'drip', chunk: 256 * 1024, everyMs: 50 } });
    expect((await fetchTo('paused', 'paused.bin', up.url('paused.bin'), want)).data?.fetchToMirror.__typename).toBe(
      'FetchStarted',
    );
    const { id } = await row('paused');
    // A part in the bucket, and the upstream's ETag recorded with the row (for If-Range).
    await until('the first part and the ETag', async () => {
      const [u, r] = await Promise.all([t.app.db.prisma.mirrorUpload.findUnique({ where: { id } }), row('paused')]);
      return Number(u?.bytesDone ?? 0) >= PART && r.etag !== null;
    });
    expect((await control('pauseMirrorFetch', 'paused')).data?.pauseMirrorFetch.__typename).toBe('MirrorVersion');
    expect((await row('paused')).state).toBe('PAUSED');
    // The checkpoint stays through the pause: nothing of the parts already sent is thrown away.
    const kept = Number((await t.app.db.prisma.mirrorUpload.findUniqueOrThrow({ where: { id } })).bytesDone);
    expect(kept).toBeGreaterThanOrEqual(PART);
    expect(kept % PART).toBe(0);
    expect(kept).toBeLessThan(body.length);
    up.files.set('paused.bin', { body }); // the rest at once
    const n = up.requests.length;
    expect((await control('resumeMirrorFetch', 'paused')).data?.resumeMirrorFetch.__typename).toBe('MirrorVersion');
    const done = await until('PRESENT', async () => {
      const r = await row('paused');
      if (r.state === 'FAILED') throw new Error(r.error ?? 'failed');
      return r.state === 'PRESENT' && r;
    });
    expect(done.actualSha256).toBe(want);
    const asked = up.requests.slice(n).filter((q) => q.name === 'paused.bin');
    expect(asked.map((q) => [q.range, q.ifRange])).toEqual([[`bytes=${kept}-`, `"${want}"`]]);
    expect(await objects()).toContain(blobKey(want));
    expect(await t.app.db.prisma.mirrorUpload.count({ where: { id } })).toBe(0);
  }, 120_000);

  it('fails a download whose upstream keeps ending early, and its retry continues from the checkpoint', async () => {
    const body = bytes(PART + 5000, 42);
    const want = sha(body);
    // The upstream claims the whole length but never sends past PART + 1000 bytes.
    up.files.set('short.bin', { body, fault: { kind: 'short', bytes: PART + 1000 } });
    await fetchTo('short', 'short.bin', up.url('short.bin'), want);
    const failed = await until('FAILED', async () => {
      const r = await row('short');
      return r.state === 'FAILED' && r;
    });
    expect(failed.error).toMatch(/gave up after 2 attempts/);
    const kept = Number((await t.app.db.prisma.mirrorUpload.findUniqueOrThrow({ where: { id: failed.id } })).bytesDone);
    expect(kept).toBe(PART);
    up.files.set('short.bin', { body });
    const n = up.requests.length;
    expect((await control('retryMirrorFetch', 'short')).data?.retryMirrorFetch.__typename).toBe('MirrorVersion');
    const done = await until('PRESENT', async () => {
      const r = await row('short');
      return r.state === 'PRESENT' && r;
    });
    expect(done.actualSha256).toBe(want);
    expect(up.requests.slice(n).map((q) => q.range)).toEqual([`bytes=${kept}-`]);
    const got = await fetch(`${base}/mirror/short/v1/short.bin`, { headers: { authorization: `Bearer ${token}` } });
    expect(sha(Buffer.from(await got.arrayBuffer()))).toBe(want);
  }, 120_000);

  it('never loses a blob to the removal of a version while another version lands the same bytes', async () => {
    const body = bytes(300_000, 43);
    const want = sha(body);
    up.files.set('shared.bin', { body });
    await fetchTo('race-a', 'shared.bin', up.url('shared.bin'), want);
    await until('race-a PRESENT', async () => (await row('race-a')).state === 'PRESENT');
    // The removal of race-a stops right before its delete, its decision made (no row names the bytes) ...
    let release = () => {};
    const released = new Promise<void>((r) => {
      release = r;
    });
    let deciding = () => {};
    const decided = new Promise<void>((r) => {
      deciding = r;
    });
    blobClaimHooks.beforeDelete = async () => {
      deciding();
      await released;
    };
    try {
      const removal = control('removeMirrorVersion', 'race-a');
      await decided;
      // ... while race-b fetches the same bytes: the bucket holds them still, so its write counts on that blob.
      await fetchTo('race-b', 'shared.bin', up.url('shared.bin'), want);
      await until('race-b landing (PRESENT, or waiting on the blob lock)', async () => {
        if ((await row('race-b')).state === 'PRESENT') return true;
        const [w] = await t.app.db.prisma.$queryRaw<{ n: bigint }[]>`
          SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`;
        return Number(w?.n ?? 0) > 0;
      });
      release();
      expect((await removal).data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
    } finally {
      release();
      blobClaimHooks.beforeDelete = undefined;
    }
    // race-b ends PRESENT with its bytes in the bucket (fetched again after the delete), never PRESENT without.
    const b = await until('race-b PRESENT', async () => {
      const r = await row('race-b');
      return r.state === 'PRESENT' && (await objects()).includes(blobKey(want)) && r;
    });
    expect(b.actualSha256).toBe(want);
    const got = await fetch(`${base}/mirror/race-b/v1/shared.bin`, { headers: { authorization: `Bearer ${token}` } });
    expect(got.status).toBe(200);
    expect(sha(Buffer.from(await got.arrayBuffer()))).toBe(want);
  }, 120_000);
});
