import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { bytes } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runMirrorMigrate } from '../src/mirror/migrate-command.js';
import type { MirrorStore } from '../src/mirror/store/store.js';
import { type FakeFile, type FakeHub, fileSha256, startFakeHub } from './fixtures/fake-hub.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// `hangar mirror migrate --to s3://…`, as an operator runs it: a server on `file` fetched a repository (two files
// with the same bytes, one other), is stopped, the command moves the mirror into s3rver's bucket (test/fixtures/
// s3.ts) with the server's environment, and a server with its own, empty data dir on HANGAR_MIRROR_STORE=s3://…
// serves every file. A first run cut off half-way (a write that fails in the middle of a blob) leaves nothing
// switched, and the second run copies only what the first did not.

const REPO = 'acme/moving';
const COMMIT = 'a1b2c3'.repeat(6) + 'a1b2';
const WEIGHTS = bytes(1_200_000, 7);
const FILES: FakeFile[] = [
  { path: 'config.json', head: Buffer.from(JSON.stringify({ model_type: 'llama' })), size: 0 },
  { path: 'weights.bin', head: WEIGHTS, size: 0, lfs: true },
  // The same bytes under another name: one object in the bucket.
  { path: 'copy.bin', head: WEIGHTS, size: 0, lfs: true },
].map((f) => ({ ...f, size: f.head.length }));
const sha = (p: string) => fileSha256(FILES.find((f) => f.path === p) as FakeFile);
const BUCKET_SPEC = (s3: S3Fixture) => `s3://${s3.bucket}/mirror`;

let s3: S3Fixture;
let hub: FakeHub;
let t: TestApp;
let token: string;
let sdk: S3Client;
let otherDir: string;

async function blobs(): Promise<string[]> {
  const r = await sdk.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: 'mirror/blobs/' }));
  return (r.Contents ?? []).map((o) => path.basename(o.Key as string)).sort();
}

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  hub = await startFakeHub();
  hub.repos.set(REPO, { id: REPO, sha: COMMIT, files: FILES });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  await t.app.start();
  token = await t.token('OPERATOR', 'migrate-reader');
  otherDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-migrated-'));
});

afterAll(async () => {
  await t?.close();
  await hub?.close();
  await s3?.close();
  sdk?.destroy();
  if (otherDir) await fs.rm(otherDir, { recursive: true, force: true });
});

describe('hangar mirror migrate --to s3://… (a `file` mirror into a bucket)', () => {
  it('moves every file, verified and deduplicated, continues a run cut off half-way without recopying, and a server on the bucket serves them', async () => {
    const admin = await t.token('ADMIN', 'migrate-admin');
    const r = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "moving", version: "v1", sources: $s) { __typename ... on Error { message } } }',
      { s: FILES.map((f) => ({ url: `${hub.url}/${REPO}/resolve/${COMMIT}/${f.path}`, file: f.path })) },
      { token: admin },
    );
    expect(r.data?.fetchToMirror.__typename, JSON.stringify(r.data)).toBe('FetchStarted');
    const db = t.app.db.prisma;
    const end = Date.now() + 60_000;
    for (;;) {
      const rows = await db.mirrorFile.findMany({ where: { model: 'moving' } });
      if (rows.length === 3 && rows.every((f) => f.state === 'PRESENT')) break;
      if (rows.some((f) => f.state === 'FAILED') || Date.now() > end) throw new Error(JSON.stringify(rows));
      await new Promise((res) => setTimeout(res, 50));
    }
    const fileStorage = (await db.mirrorFile.findFirst({ where: { model: 'moving' } }))?.storageId;
    // The operator stops the server, then runs the command with its environment.
    await t.app.stop();
    const env = {
      ...process.env,
      DATABASE_URL: t.app.db.url,
      HANGAR_DATA_DIR: t.dataDir,
      HANGAR_LOG_LEVEL: 'silent',
      HANGAR_S3_FORCE_PATH_STYLE: 'true',
    };
    const lines: string[] = [];
    const print = (l: string) => lines.push(l);

    // A copy on disk that no longer hashes to its recorded sha256 is refused, and its wrong bytes leave the bucket.
    const configOnDisk = path.join(t.dataDir, 'mirror/files/moving/v1/config.json');
    const good = await fs.readFile(configOnDisk);
    await fs.writeFile(configOnDisk, Buffer.from(good.toString().toUpperCase()));
    expect(await runMirrorMigrate(['--to', BUCKET_SPEC(s3)], { env, print })).toBe(2);
    expect(lines.at(-1)).toMatch(
      /config.json hashes to [0-9a-f]{64}, not [0-9a-f]{64} .* damaged.*Nothing was switched/,
    );
    expect(await blobs()).toEqual([]);
    await fs.writeFile(configOnDisk, good);

    // First run: the write of the second blob fails half-way through its bytes.
    const cutOff = (store: MirrorStore): MirrorStore =>
      Object.assign(Object.create(store), {
        openWrite: async (id: string) => {
          const w = await store.openWrite(id);
          if (!id.endsWith(sha('weights.bin'))) return w;
          let written = 0;
          return Object.assign(Object.create(w), {
            write: async (chunk: Uint8Array) => {
              written += chunk.length;
              if (written > WEIGHTS.length / 2) throw new Error('injected: the connection to the bucket broke');
              await w.write(chunk);
            },
          });
        },
      });
    expect(await runMirrorMigrate(['--to', BUCKET_SPEC(s3)], { env, print, wrapStore: cutOff })).toBe(1);
    expect(lines.at(-1)).toMatch(/not moved: injected.*Run it again/);
    expect(await blobs()).toEqual([sha('config.json')]);
    // Nothing switched: a server on `file` would still serve from its data dir.
    expect(await db.mirrorFile.count({ where: { model: 'moving', storageId: fileStorage } })).toBe(3);
    expect(await db.auditEvent.count({ where: { action: 'migrateMirror' } })).toBe(0);

    // Second run: only the blob the first did not finish is written.
    const opened: string[] = [];
    const counting = (store: MirrorStore): MirrorStore =>
      Object.assign(Object.create(store), {
        openWrite: (id: string) => {
          opened.push(id);
          return store.openWrite(id);
        },
      });
    lines.length = 0;
    expect(
      await runMirrorMigrate([`--to=${BUCKET_SPEC(s3)}`], { env, print, wrapStore: counting }),
      lines.join('\n'),
    ).toBe(0);
    expect(opened).toEqual([`migrate-${sha('weights.bin')}`]);
    expect(lines.join('\n')).toMatch(/in the bucket already: moving\/v1\/config.json/);
    expect(lines.at(-1)).toMatch(/3 mirror files are on .* now.*HANGAR_MIRROR_STORE=s3:\/\/.*left in place/s);
    expect(await blobs()).toEqual([sha('config.json'), sha('weights.bin')].sort());
    const rows = await db.mirrorFile.findMany({ where: { model: 'moving' } });
    expect(new Set(rows.map((f) => f.storageId)).size).toBe(1);
    expect(rows[0]?.storageId).not.toBe(fileStorage);
    expect(await db.mirrorUpload.count()).toBe(0);
    const audit = await db.auditEvent.findMany({ where: { action: 'migrateMirror' } });
    expect(audit.map((a) => [a.outcome, a.actor])).toEqual([['DONE', 'system:mirror-migrate']]);
    expect(audit[0]?.message).toMatch(/3 mirror files moved .*1 blobs copied.*1 already there/);
    // The `file` copies stay where they were.
    expect((await fs.readFile(path.join(t.dataDir, 'mirror/files/moving/v1/copy.bin'))).equals(WEIGHTS)).toBe(true);
    // A third run has nothing to do.
    lines.length = 0;
    expect(await runMirrorMigrate(['--to', BUCKET_SPEC(s3)], { env, print })).toBe(0);
    expect(lines.at(-1)).toMatch(/ already \(storage .*\): nothing to do/);

    // A download the stopped server had not finished is refused: its bytes so far are only in a partial on disk.
    const paused = await db.mirrorFile.create({
      data: { model: 'later', version: 'v1', file: 'x.bin', sourceUrl: `${hub.url}/x.bin`, state: 'PAUSED' },
    });
    lines.length = 0;
    expect(await runMirrorMigrate(['--to', BUCKET_SPEC(s3)], { env, print })).toBe(2);
    expect(lines.at(-1)).toMatch(/1 mirror files are not finished \(later\/v1\/x.bin: PAUSED\).*Nothing was changed/);
    await db.mirrorFile.delete({ where: { id: paused.id } });

    // A server with its own, empty data dir on the bucket serves every file.
    const replica = await t.replica({
      HANGAR_DATA_DIR: otherDir,
      HANGAR_MIRROR_STORE: BUCKET_SPEC(s3),
      HANGAR_S3_FORCE_PATH_STYLE: 'true',
    });
    const base = await replica.start();
    for (const f of FILES) {
      const got = await fetch(`${base}/mirror/moving/v1/${f.path}`, { headers: { authorization: `Bearer ${token}` } });
      expect(got.status, f.path).toBe(200);
      expect(Buffer.from(await got.arrayBuffer()).equals(f.head), f.path).toBe(true);
    }
  });

  it('refuses a destination that is not a bucket, naming what it takes', async () => {
    const lines: string[] = [];
    expect(await runMirrorMigrate(['--to', 'file'], { print: (l) => lines.push(l) })).toBe(2);
    expect(lines[0]).toMatch(/name the bucket .* s3:\/\/bucket\/prefix/);
    lines.length = 0;
    expect(await runMirrorMigrate(['--to', 'ftp://x'], { print: (l) => lines.push(l) })).toBe(2);
    expect(lines[0]).toMatch(/is not a store.*s3:\/\/bucket\/prefix/);
  });
});
