import { createHash } from 'node:crypto';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// The mirror's figures on a bucket (s3rver, the real S3 protocol on loopback): what the mirror holds there instead
// of the disk's free space (each sha256 once, counted from PostgreSQL, and checked against a listing of the bucket
// when asked), and HANGAR_S3_QUOTA: a fetch of known size that would pass it is refused before a byte moves, naming
// the setting.

const QUOTA = 3_000_000;
const WEIGHTS = bytes(1_200_000, 41);
const CONFIG = Buffer.from('{"model_type":"llama"}');
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

let s3: S3Fixture;
let up: Upstream;
let t: TestApp;
let base: string;
let admin: string;

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  up = await startUpstream();
  t = await startTestApp({
    HANGAR_MIRROR_STORE: `s3://${s3.bucket}/mirror`,
    HANGAR_S3_FORCE_PATH_STYLE: 'true',
    HANGAR_S3_QUOTA: '3MB',
  });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'space-admin');
}, 60_000);

afterAll(async () => {
  await t?.close();
  await up?.close();
  await s3?.close();
});

/** Polls until `read` gives a row (or fails after 20 s). */
async function waitFor<T>(read: () => Promise<T | null>): Promise<T> {
  const until = Date.now() + 20_000;
  for (;;) {
    const row = await read();
    if (row) return row;
    if (Date.now() > until) throw new Error('timed out waiting for the row');
    await new Promise((r) => setTimeout(r, 100));
  }
}

const figures = async (token = admin) => {
  const r = await t.gql(
    '{ mirror { bucket diskUsedBytes diskFreeBytes bucketQuotaBytes bucketListedBytes } }',
    {},
    { token },
  );
  expect(r.errors).toBeUndefined();
  return r.data?.mirror as Record<string, unknown>;
};

describe('the mirror on a bucket: what it holds there, and HANGAR_S3_QUOTA', () => {
  it('counts each blob once from PostgreSQL, agrees with a listing of the bucket, and refuses a fetch past the quota before it starts', async () => {
    // The same weights in two versions (one object in the bucket), and a small config.
    for (const [path, body] of [
      ['m/v1/weights.bin', WEIGHTS],
      ['m/v1/config.json', CONFIG],
      ['m/v2/weights.bin', WEIGHTS],
    ] as const) {
      const put = await fetch(`${base}/mirror/${path}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(body) },
        body: new Uint8Array(body),
      });
      expect(put.status, path).toBe(201);
    }
    const held = WEIGHTS.length + CONFIG.length;
    expect(await figures()).toEqual({
      bucket: `s3://${s3.bucket}/mirror/`,
      diskUsedBytes: held,
      diskFreeBytes: QUOTA - held,
      bucketQuotaBytes: QUOTA,
      // The bucket, listed, holds what PostgreSQL says it does.
      bucketListedBytes: held,
    });

    // A fetch whose size is given and would pass the quota: refused, naming the setting, and nothing asked upstream.
    up.files.set('big.bin', { body: bytes(2_000_000, 42) });
    const refused = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "big", version: "v1", sources: $s) { __typename ... on Error { message } } }',
      { s: [{ url: up.url('big.bin'), file: 'big.bin', size: 2_000_000 }] },
      { token: admin },
    );
    expect(refused.data?.fetchToMirror.__typename).toBe('ConflictError');
    expect(refused.data?.fetchToMirror.message).toMatch(
      /not enough room in the bucket for big\/v1: it needs 2000000 bytes and 1799978 are left of HANGAR_S3_QUOTA \(3000000 bytes, 2\.9 MiB\) in s3:\/\/hangar-mirror\/mirror\/ .*raise HANGAR_S3_QUOTA/,
    );
    expect(up.requests.filter((r) => r.name === 'big.bin')).toEqual([]);
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'big' } })).toBe(0);

    // Its size not given: known once the upstream answers, and refused then, before a byte reaches the bucket.
    const unsized = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "unsized", version: "v1", sources: $s) { __typename ... on Error { message } } }',
      { s: [{ url: up.url('big.bin'), file: 'big.bin' }] },
      { token: admin },
    );
    expect(unsized.data?.fetchToMirror.__typename).toBe('FetchStarted');
    const failed = await waitFor(() =>
      t.app.db.prisma.mirrorFile.findFirst({ where: { model: 'unsized', state: 'FAILED' } }),
    );
    expect(failed.bytesDone).toBe(0n);
    expect(failed.error).toMatch(
      /^not enough room in the bucket: unsized\/v1\/big\.bin has 2000000 bytes still to come and 1799978 are left of HANGAR_S3_QUOTA .*raise HANGAR_S3_QUOTA/,
    );
    await t.app.db.prisma.mirrorFile.deleteMany({ where: { model: 'unsized' } });

    // An upload past the quota: refused before its bytes are taken, naming the setting, not the disk.
    const big = bytes(2_000_000, 43);
    const upload = await fetch(`${base}/mirror/up/v1/big.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(big) },
      body: new Uint8Array(big),
    });
    expect(upload.status).toBe(409);
    expect(await upload.text()).toMatch(
      /not enough room in the bucket for the upload of up\/v1\/big\.bin: .*HANGAR_S3_QUOTA/,
    );

    expect((await figures()).bucketListedBytes).toBe(held);
  });

  it('reads HANGAR_S3_QUOTA as a size, and refuses one it cannot read, naming it', () => {
    const base = { HANGAR_DATA_DIR: '/nonexistent' };
    expect(loadConfig(base).s3QuotaBytes).toBeNull();
    expect(loadConfig({ ...base, HANGAR_S3_QUOTA: '500GiB' }).s3QuotaBytes).toBe(500 * 1024 ** 3);
    expect(loadConfig({ ...base, HANGAR_S3_QUOTA: '2 TB' }).s3QuotaBytes).toBe(2e12);
    expect(() => loadConfig({ ...base, HANGAR_S3_QUOTA: 'lots' })).toThrow(/HANGAR_S3_QUOTA="lots" .*500GiB/);
  });
});
