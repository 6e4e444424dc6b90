import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type S3Fixture, startS3, useS3Env } from '../../../test/fixtures/s3.js';
import { freshDatabase } from '../../../test/harness.js';
import type { Database } from '../../db/database.js';
import type { RetryState } from '../transfer.js';
import { fetchIntoStore } from './fetch-into-store.js';
import { type MirrorStore, openMirrorStore, parseStoreSpec } from './store.js';

// The rules of the disk fetch (transfer.ts over download/resumable.ts), held by the fetch into a store too: the
// same loop writes into a bucket's multipart upload instead of a partial file. Each test is an upstream that
// misbehaves as real ones do (the fault upstream stands in for the Hub's file server), on both stores.

const PART = 256 * 1024;

let database: Database;
let s3: S3Fixture;
let up: Upstream;
let dataDir: string;
const open: MirrorStore[] = [];

beforeAll(async () => {
  [database, s3, up] = await Promise.all([freshDatabase(), startS3(), startUpstream()]);
  useS3Env(s3);
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-fetch-rules-'));
});

afterAll(async () => {
  for (const s of open) s.close();
  await up?.close();
  await s3?.close();
  await database?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

async function storeOf(kind: 'file' | 's3') {
  const store = await openMirrorStore({
    spec: parseStoreSpec(kind === 'file' ? 'file' : `s3://${s3.bucket}/rules`),
    root: path.join(dataDir, 'mirror'),
    db: database.prisma,
    forcePathStyle: true,
    partBytes: PART,
  });
  open.push(store);
  return store;
}

const asked = (name: string) => up.requests.filter((r) => r.name === name);

describe.each(['s3', 'file'] as const)('the fetch into the %s store keeps the disk fetch rules', (kind) => {
  it('waits as long as a 503 asks with Retry-After, and the wait is told as the retry state', async () => {
    const store = await storeOf(kind);
    const body = bytes(5000, 31);
    const name = `${kind}-retry-after.bin`;
    up.files.set(name, { body, fault: { kind: 'status', status: 503, times: 1, headers: { 'retry-after': '2' } } });
    const retries: { state: RetryState; at: number }[] = [];
    const started = Date.now();
    const got = await fetchIntoStore({
      store,
      id: `${kind}-ra`,
      url: up.url(name),
      giveUpAfterMs: 60_000,
      onRetry: (state) => state && retries.push({ state, at: Date.now() }),
    });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body) });
    // The backoff alone would have asked again after 0.5 s; the upstream asked for 2.
    expect(retries).toHaveLength(1);
    expect(retries[0]?.state.reason).toMatch(/HTTP 503/);
    expect((retries[0]?.state.nextAt.getTime() ?? 0) - (retries[0]?.at ?? 0)).toBeGreaterThanOrEqual(1900);
    expect(asked(name).map((r) => r.status)).toEqual([503, 200]);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1900);
  });

  it('never takes an HTML page answered with 200 for the file: it asks again', async () => {
    const store = await storeOf(kind);
    const body = bytes(7000, 32);
    const name = `${kind}-html.bin`;
    up.files.set(name, { body, fault: { kind: 'html', times: 1 } });
    const got = await fetchIntoStore({ store, id: `${kind}-html`, url: up.url(name), backoffMs: () => 10 });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body), size: body.length });
    expect(asked(name)).toHaveLength(2);
    const page = Buffer.from('<html><body>Service temporarily unavailable</body></html>');
    expect(await store.stat(sha256(page))).toBeNull();
  });

  it('resumes with If-Range: an upstream whose file changed (new ETag) between attempts starts over, not spliced', async () => {
    const store = await storeOf(kind);
    const old = bytes(PART * 3, 33);
    const next = bytes(PART * 3, 34);
    const name = `${kind}-changed.bin`;
    const id = `${kind}-changed`;
    // No sha256 published (a plain web server: ETag "v-1", then "v-2"): only If-Range can tell the file changed.
    up.files.set(name, { body: old, noDigest: true, fault: { kind: 'drip', chunk: 64 * 1024, everyMs: 30 } });
    const stop = new AbortController();
    let etag: string | null = null;
    let heard = 0;
    const first = await fetchIntoStore({
      store,
      id,
      url: up.url(name),
      signal: stop.signal,
      onProgress: (done, _total, tag) => {
        etag = tag ?? etag;
        heard = done;
        if (done >= PART + 64 * 1024) stop.abort(); // paused half-way, past the first part's checkpoint
      },
    });
    expect(first).toMatchObject({ ok: false, reason: 'cancelled' });
    expect(heard).toBeGreaterThan(PART);
    expect(etag).toBe('"v-1"');
    up.files.set(name, { body: old, noDigest: true, fault: { kind: 'change', afterRequests: 1, next } });
    const again = await fetchIntoStore({ store, id, url: up.url(name), etag });
    expect(again).toMatchObject({ ok: true, sha256: sha256(next), size: next.length });
    const [, resumed, restarted] = asked(name);
    expect(resumed).toMatchObject({ ifRange: '"v-1"', status: 200 });
    expect(resumed?.range).toMatch(/^bytes=[1-9]\d*-$/);
    expect(restarted).toBeUndefined(); // the 200 itself was the whole new file
  });

  it('rides out an upstream that never answers until HANGAR_MIRROR_GIVE_UP_AFTER, not a count of attempts', async () => {
    const store = await storeOf(kind);
    const body = bytes(9000, 35);
    const name = `${kind}-silent.bin`;
    up.files.set(name, { body, fault: { kind: 'stall', afterBytes: 0, times: 1000 } });
    const got = await fetchIntoStore({
      store,
      id: `${kind}-silent`,
      url: up.url(name),
      stallMs: 150,
      maxAttempts: 2,
      giveUpAfterMs: 1500,
      backoffMs: () => 50,
    });
    expect(got).toMatchObject({ ok: false, reason: expect.stringContaining('HANGAR_MIRROR_GIVE_UP_AFTER') });
    // Silence is an outage: it did not count against the two attempts.
    expect(asked(name).length).toBeGreaterThan(2);
  });

  it('asks whether the mirror already holds the sha256 the upstream publishes before taking a byte of it', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART * 2, 36);
    const name = `${kind}-held.bin`;
    up.files.set(name, { body });
    const told: string[] = [];
    const got = await fetchIntoStore({
      store,
      id: `${kind}-held`,
      url: up.url(name),
      alreadyHeld: async (sha) => {
        told.push(sha);
        return true;
      },
    });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body), size: body.length, linked: true });
    expect(told).toEqual([sha256(body)]);
    // Nothing was written: the store holds no new blob, and no upload was left behind.
    expect(await store.stat(sha256(body))).toBeNull();
    expect(await database.prisma.mirrorUpload.count({ where: { id: `${kind}-held` } })).toBe(0);
  });
});
