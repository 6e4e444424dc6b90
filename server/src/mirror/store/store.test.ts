import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { buffer } from 'node:stream/consumers';
import { fileURLToPath } from 'node:url';
import { createLogger } from '@hangar/common/log';
import { waitUntil } from '@hangar/common/retry';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type S3Fixture, startS3, useS3Env } from '../../../test/fixtures/s3.js';
import { freshDatabase } from '../../../test/harness.js';
import type { Database } from '../../db/database.js';
import { fetchIntoStore } from './fetch-into-store.js';
import { sendStoreBlob } from './send-blob.js';
import { type MirrorStore, openMirrorStore, parseStoreSpec } from './store.js';

// The mirror's bytes on both stores, through the same interface: a directory under the data dir (`file`) and an
// S3 bucket (`s3`, s3rver on loopback through the AWS SDK). A fetch hashes while the bytes stream, resumes a cut
// connection with a Range, and after a kill -9 continues from the last checkpoint (s3: the last part recorded in
// PostgreSQL with its sha256 state), not from zero. Small parts (256 KiB) keep the files small; s3rver, unlike
// AWS, accepts parts under 5 MiB.

const PART = 256 * 1024;
const here = path.dirname(fileURLToPath(import.meta.url));
const child = path.resolve(here, '../../../test/fixtures/store-fetch-child.ts');

let database: Database;
let s3: S3Fixture;
let up: Upstream;
let dataDir: string;
const open: MirrorStore[] = [];

beforeAll(async () => {
  [database, s3, up] = await Promise.all([freshDatabase(), startS3(), startUpstream()]);
  useS3Env(s3);
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-store-'));
});

afterAll(async () => {
  for (const s of open) s.close();
  await up?.close();
  await s3?.close();
  await database?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

const specs = {
  file: () => 'file',
  s3: () => `s3://${s3.bucket}/site-a`,
};

async function storeOf(kind: keyof typeof specs, root = path.join(dataDir, 'mirror')) {
  const store = await openMirrorStore({
    spec: parseStoreSpec(specs[kind]()),
    root,
    db: database.prisma,
    forcePathStyle: true,
    partBytes: PART,
  });
  open.push(store);
  return store;
}

describe.each(['file', 's3'] as const)('the mirror store: %s', (kind) => {
  it('keeps a fetched file under the sha256 hashed while its bytes streamed, once however often it is fetched', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART * 3 + 1234, 11);
    up.files.set(`${kind}-a.gguf`, { body });
    const before = (await store.usage()).usedBytes;
    const first = await fetchIntoStore({ store, id: `${kind}-a1`, url: up.url(`${kind}-a.gguf`) });
    expect(first).toMatchObject({ ok: true, sha256: sha256(body), size: body.length, held: false });
    expect(await store.stat(sha256(body))).toEqual({ size: body.length });
    expect(Buffer.compare(await buffer(await store.read(sha256(body))), body)).toBe(0);
    // The same bytes under another version: kept once.
    const again = await fetchIntoStore({ store, id: `${kind}-a2`, url: up.url(`${kind}-a.gguf`) });
    expect(again).toMatchObject({ ok: true, sha256: sha256(body), held: true });
    expect((await store.usage()).usedBytes - before).toBe(body.length);
    if (kind === 's3')
      expect(await database.prisma.mirrorUpload.count({ where: { id: { in: [`${kind}-a1`, `${kind}-a2`] } } })).toBe(0);
  });

  it('keeps the bytes in order when the upstream sends faster than the store takes them', async () => {
    // http-get.ts hands the next block over before the last one is written: a write must not overtake another.
    const store = await storeOf(kind);
    const body = bytes(24 * 1024 * 1024 + 3, 18);
    up.files.set(`${kind}-f.bin`, { body });
    const got = await fetchIntoStore({ store, id: `${kind}-f`, url: up.url(`${kind}-f.bin`) });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body), size: body.length });
    expect(sha256(await buffer(await store.read(sha256(body))))).toBe(sha256(body));
    await store.remove(sha256(body));
  });

  it('reads a byte range, and forgets a removed blob', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART + 999, 12);
    up.files.set(`${kind}-r.bin`, { body });
    const got = await fetchIntoStore({ store, id: `${kind}-r`, url: up.url(`${kind}-r.bin`) });
    expect(got.ok).toBe(true);
    const range = await buffer(await store.read(sha256(body), { start: PART - 10, end: PART + 20 }));
    expect(Buffer.compare(range, body.subarray(PART - 10, PART + 21))).toBe(0);
    const used = (await store.usage()).usedBytes;
    await store.remove(sha256(body));
    expect(await store.stat(sha256(body))).toBeNull();
    expect((await store.usage()).usedBytes).toBe(used - body.length);
  });

  it('resumes a cut connection with a Range request, and refuses bytes that are not the sha256 asked for', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART * 2 + 77, 13);
    up.files.set(`${kind}-c.bin`, { body, fault: { kind: 'reset', afterBytes: PART + 500, times: 1 } });
    const got = await fetchIntoStore({ store, id: `${kind}-c`, url: up.url(`${kind}-c.bin`) });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body) });
    const asked = up.requests.filter((r) => r.name === `${kind}-c.bin`).map((r) => r.range);
    expect(asked[0]).toBeUndefined();
    expect(asked[1]).toMatch(/^bytes=[1-9]\d*-$/);

    const other = bytes(PART, 14);
    up.files.set(`${kind}-w.bin`, { body: other });
    const wrong = await fetchIntoStore({
      store,
      id: `${kind}-w`,
      url: up.url(`${kind}-w.bin`),
      expectedSha256: sha256(body.subarray(0, 10)),
    });
    expect(wrong).toMatchObject({ ok: false, reason: expect.stringContaining('sha256 mismatch') });
    expect(await store.stat(sha256(other))).toBeNull();

    // Nothing asked for, but the upstream published the file's sha256 (the Hub's X-Linked-Etag): held to it.
    const real = bytes(PART, 19);
    up.files.set(`${kind}-x.bin`, { body: real, fault: { kind: 'wrong-bytes' } });
    const flipped = Buffer.from(real.map((x) => x ^ 0xff));
    const published = await fetchIntoStore({ store, id: `${kind}-x`, url: up.url(`${kind}-x.bin`) });
    expect(published).toMatchObject({
      ok: false,
      reason: expect.stringContaining(`the upstream published ${sha256(real)}`),
    });
    expect(await store.stat(sha256(flipped))).toBeNull();
  });

  it('fails an attempt whose upstream goes silent (the stall timer), and resumes it with a Range', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART + 3000, 21);
    up.files.set(`${kind}-q.bin`, { body, fault: { kind: 'stall', afterBytes: 5000, times: 1 } });
    // Without the timer the silent socket holds the fetch until the test's own timeout.
    const got = await fetchIntoStore({ store, id: `${kind}-q`, url: up.url(`${kind}-q.bin`), stallMs: 300 });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body) });
    const asked = up.requests.filter((r) => r.name === `${kind}-q.bin`).map((r) => r.range);
    expect(asked).toHaveLength(2);
    expect(asked[1]).toMatch(/^bytes=[1-9]\d*-$/);
  }, 15_000);

  it('takes every byte it writes from the bandwidth limit, a slice at a time', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART + 5000, 22);
    up.files.set(`${kind}-b.bin`, { body });
    // Stands in for the mirror's token bucket (bandwidth.ts): records what was taken instead of waiting.
    const taken: number[] = [];
    const throttle = { slice: () => 1000, take: async (n: number) => void taken.push(n) };
    const got = await fetchIntoStore({ store, id: `${kind}-b`, url: up.url(`${kind}-b.bin`), throttle });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body) });
    expect(taken.reduce((a, b) => a + b, 0)).toBe(body.length);
    expect(Math.max(...taken)).toBeLessThanOrEqual(1000);
  });

  it('continues from its last checkpoint after the fetching process is killed with SIGKILL, not from zero', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART * 6 + 4321, 15);
    const name = `${kind}-k.bin`;
    up.files.set(name, { body, fault: { kind: 'drip', chunk: 64 * 1024, everyMs: 40 } });
    const id = `${kind}-k`;
    const proc: ChildProcess = spawn(process.execPath, ['--import', 'tsx', child], {
      env: {
        ...process.env,
        DATABASE_URL: database.url,
        STORE: specs[kind](),
        STORE_ROOT: path.join(dataDir, 'mirror'),
        PART_BYTES: String(PART),
        WRITE_ID: id,
        URL: up.url(name),
      },
      stdio: 'ignore',
    });
    const exited = new Promise((r) => proc.once('exit', r));
    // What a restart can rely on: the parts recorded in PostgreSQL (s3), the partial on disk (file).
    const checkpointed = async () =>
      kind === 's3'
        ? Number((await database.prisma.mirrorUpload.findUnique({ where: { id } }))?.bytesDone ?? 0)
        : (await fs.stat(path.join(dataDir, 'mirror', 'partial', `${id}.blob-part`)).catch(() => ({ size: 0 }))).size;
    let held = 0;
    const reached = await waitUntil(
      () => {
        void checkpointed().then((n) => {
          held = n;
        });
        return held >= PART * 2;
      },
      { timeoutMs: 60_000, pollMs: 50 },
    );
    proc.kill('SIGKILL');
    await exited;
    expect(reached).toBe(true);
    const kept = await checkpointed();
    expect(kept).toBeLessThan(body.length);
    if (kind === 's3') expect(kept % PART).toBe(0); // whole parts only

    up.files.set(name, { body }); // no more dripping: the rest comes at once
    const requestsBefore = up.requests.length;
    const got = await fetchIntoStore({ store, id, url: up.url(name) });
    expect(got).toMatchObject({ ok: true, sha256: sha256(body), size: body.length, resumedFrom: kept });
    expect(up.requests.slice(requestsBefore).map((r) => r.range)).toEqual([`bytes=${kept}-`]);
    expect(Buffer.compare(await buffer(await store.read(sha256(body))), body)).toBe(0);
  });
});

/** An HTTP server that answers /<sha256> from `store` as /mirror does, presigning when asked. */
async function serveFrom(store: MirrorStore, presignSeconds: number | null = null) {
  const server = http.createServer((req, res) => {
    void sendStoreBlob(req, res, {
      store,
      sha256: (req.url ?? '/').slice(1),
      fileName: 'model.gguf',
      cacheControl: 'public, max-age=300',
      presignSeconds,
      missing: () => res.writeHead(404).end('no such file in the mirror\n'),
      log: createLogger('silent'),
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: (sha: string) => `http://127.0.0.1:${(server.address() as AddressInfo).port}/${sha}`,
    close: () => new Promise((r) => server.close(r)),
  };
}

describe.each(['file', 's3'] as const)('serving from the mirror store: %s', (kind) => {
  it('answers a Range with 206 and the bytes asked for, If-None-Match with 304, a range past the end with 416', async () => {
    const store = await storeOf(kind);
    const body = bytes(PART + 5000, 17);
    up.files.set(`${kind}-s.bin`, { body });
    expect((await fetchIntoStore({ store, id: `${kind}-s`, url: up.url(`${kind}-s.bin`) })).ok).toBe(true);
    const server = await serveFrom(store);
    try {
      const sha = sha256(body);
      const whole = await fetch(server.url(sha));
      expect(whole.status).toBe(200);
      expect(whole.headers.get('etag')).toBe(`"${sha}"`);
      expect(Buffer.compare(Buffer.from(await whole.arrayBuffer()), body)).toBe(0);
      const part = await fetch(server.url(sha), { headers: { range: `bytes=${PART}-` } });
      expect(part.status).toBe(206);
      expect(part.headers.get('content-range')).toBe(`bytes ${PART}-${body.length - 1}/${body.length}`);
      expect(Buffer.compare(Buffer.from(await part.arrayBuffer()), body.subarray(PART))).toBe(0);
      const head = await fetch(server.url(sha), { headers: { range: 'bytes=0-7' } });
      expect(Buffer.from(await head.arrayBuffer())).toEqual(body.subarray(0, 8));
      expect((await fetch(server.url(sha), { headers: { 'if-none-match': `"${sha}"` } })).status).toBe(304);
      const past = await fetch(server.url(sha), { headers: { range: `bytes=${body.length}-` } });
      expect(past.status).toBe(416);
      await past.arrayBuffer();
      const missing = await fetch(server.url(sha256(Buffer.from('not kept'))));
      expect(missing.status).toBe(404);
      await missing.arrayBuffer();
    } finally {
      await server.close();
    }
  });
});

describe('the mirror store on s3', () => {
  it('keeps its storage id in the bucket: a replica with another data dir finds the same one', async () => {
    const a = await storeOf('s3', path.join(dataDir, 'replica-a'));
    const b = await storeOf('s3', path.join(dataDir, 'replica-b'));
    expect(await a.storageId()).toBeNull();
    const [x, y] = await Promise.all([a.claimStorageId(), b.claimStorageId()]);
    expect(x).toBe(y);
    expect(await b.storageId()).toBe(x);
    // The file store's id stays with its own directory.
    const f = await storeOf('file', path.join(dataDir, 'replica-c'));
    expect(await f.claimStorageId()).not.toBe(x);
  });

  it('finishes placing a whole upload after a crash between its completion and its copy, without fetching it again', async () => {
    const store = await storeOf('s3');
    // The bucket's connection cut at every copy until the first fetch gives up: as if the process died there.
    const client = (store as unknown as { client: { send: (c: object) => Promise<unknown> } }).client;
    const send = client.send.bind(client);
    let cut = true;
    client.send = async (cmd) => {
      if (cut && cmd.constructor.name === 'CopyObjectCommand') throw new Error('the connection to the bucket was cut');
      return send(cmd);
    };
    const body = bytes(PART * 2 + 5, 20);
    up.files.set('placed.bin', { body });
    const first = await fetchIntoStore({ store, id: 'placed', url: up.url('placed.bin'), maxAttempts: 1 });
    expect(first).toMatchObject({ ok: false, reason: expect.stringContaining('was cut') });
    expect((await database.prisma.mirrorUpload.findUnique({ where: { id: 'placed' } }))?.uploadId).toBe('');
    cut = false;
    const n = up.requests.length;
    const second = await fetchIntoStore({ store, id: 'placed', url: up.url('placed.bin') });
    expect(second).toMatchObject({ ok: true, sha256: sha256(body), size: body.length, held: false });
    expect(up.requests.slice(n).map((r) => r.range)).toEqual([`bytes=${body.length}-`]);
    expect(await store.stat(sha256(body))).toEqual({ size: body.length });
    expect(await database.prisma.mirrorUpload.findUnique({ where: { id: 'placed' } })).toBeNull();
  });

  it('hands out a presigned URL that fetches the blob without Hangar in the way', async () => {
    const store = await storeOf('s3');
    const body = bytes(5000, 16);
    up.files.set('p.bin', { body });
    expect((await fetchIntoStore({ store, id: 'p', url: up.url('p.bin') })).ok).toBe(true);
    const url = await store.presign(sha256(body), { seconds: 60, fileName: 'model.gguf' });
    expect(url).toMatch(/X-Amz-Signature=/);
    const res = await fetch(url as string);
    expect(res.status).toBe(200);
    expect(Buffer.compare(Buffer.from(await res.arrayBuffer()), body)).toBe(0);
    expect(await (await storeOf('file')).presign(sha256(body), { seconds: 60 })).toBeNull();

    // Served with HANGAR_S3_PRESIGN: a 302 to the bucket, never cached; a client that follows it gets the bytes.
    const server = await serveFrom(store, 60);
    try {
      const redirect = await fetch(server.url(sha256(body)), { redirect: 'manual' });
      expect(redirect.status).toBe(302);
      expect(redirect.headers.get('location')).toMatch(new RegExp(`^${s3.endpoint}/.*X-Amz-Expires=60`));
      expect(redirect.headers.get('cache-control')).toBe('private, no-store');
      const followed = await fetch(server.url(sha256(body)));
      expect(sha256(Buffer.from(await followed.arrayBuffer()))).toBe(sha256(body));
    } finally {
      await server.close();
    }
  });
});
