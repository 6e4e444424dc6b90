import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { bytes, sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type S3Fixture, startS3, useS3Env } from '../../../test/fixtures/s3.js';
import { freshDatabase } from '../../../test/harness.js';
import type { Database } from '../../db/database.js';
import { LocalCopies, LocalCopyError } from './local-copy.js';
import { BlobMismatchError, putBlob } from './put-blob.js';
import { blobKey, type MirrorStore, openMirrorStore, parseStoreSpec } from './store.js';

// What training reads as files when the mirror is in a bucket (s3rver on loopback through the AWS SDK): bytes put
// in by sha256 (checked again as they go in), and the replica's local copy of a blob, verified as it is written,
// fetched once for callers asking at the same time, and refused when the bucket's object is not those bytes.

let database: Database;
let s3: S3Fixture;
let dir: string;
let store: MirrorStore;
let sdk: S3Client;

beforeAll(async () => {
  [database, s3] = await Promise.all([freshDatabase(), startS3()]);
  useS3Env(s3);
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-copies-'));
  store = await openMirrorStore({
    spec: parseStoreSpec(`s3://${s3.bucket}/copies`),
    root: path.join(dir, 'mirror'),
    db: database.prisma,
    forcePathStyle: true,
    partBytes: 256 * 1024,
  });
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
});
afterAll(async () => {
  store?.close();
  sdk?.destroy();
  await s3?.close();
  await database?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

/** The store, counting the reads it is asked for. */
function counted(s: MirrorStore) {
  const seen = { reads: 0 };
  const wrapped: MirrorStore = Object.create(s);
  wrapped.read = (sha, range) => {
    seen.reads++;
    return s.read(sha, range);
  };
  return { store: wrapped, seen };
}

describe('local copies of blobs in a bucket', () => {
  it('puts bytes in by sha256, and copies them out once for eight callers at once, verified', async () => {
    const body = bytes(600_000, 7);
    const sha = sha256(body);
    await putBlob(store, sha, [body.subarray(0, 100_000), body.subarray(100_000)]);
    expect(await store.stat(sha)).toEqual({ size: body.length });
    // Again: nothing new is written, the blob is the same.
    await putBlob(store, sha, [body]);

    const { store: watched, seen } = counted(store);
    const copies = new LocalCopies({ store: watched, dir: path.join(dir, 'cache', 'sha256') });
    const got = await Promise.all(Array.from({ length: 8 }, () => copies.copy(sha)));
    expect(new Set(got)).toEqual(new Set([path.join(dir, 'cache', 'sha256', sha)]));
    expect(seen.reads).toBe(1);
    expect(sha256(await fs.readFile(got[0] as string))).toBe(sha);
    // Held now: no read at all.
    await copies.copy(sha);
    expect(seen.reads).toBe(1);
    expect((await fs.readdir(path.join(dir, 'cache', 'sha256'))).filter((f) => f.endsWith('.part'))).toEqual([]);
  });

  it('refuses bytes that are not the sha256 named, keeping nothing under it', async () => {
    const body = bytes(10_000, 3);
    const wrong = sha256(bytes(10_000, 4));
    await expect(putBlob(store, wrong, [body])).rejects.toThrow(BlobMismatchError);
    expect(await store.stat(wrong)).toBeNull();
    expect(await store.stat(sha256(body))).toBeNull();
  });

  it('refuses to copy an object changed in the bucket behind its back, and leaves no copy', async () => {
    const named = sha256(bytes(5000, 9));
    await sdk.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `copies/${blobKey(named)}`, Body: bytes(5000, 10) }));
    const cacheDir = path.join(dir, 'cache-b');
    const copies = new LocalCopies({ store, dir: cacheDir });
    await expect(copies.copy(named)).rejects.toThrow(/changed in the bucket by something other than Hangar/);
    expect(await fs.readdir(cacheDir)).toEqual([]);
    const missing = sha256(bytes(10, 1));
    await expect(copies.copy(missing)).rejects.toThrow(LocalCopyError);
  });
});
