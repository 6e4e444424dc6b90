import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { GetObjectCommand, ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { sleep } from '@hangar/common/retry';
import { bytes } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runMirrorMigrate } from '../src/mirror/migrate-command.js';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// `hangar mirror migrate --to s3://…` on an external DATABASE_URL, where no database lock keeps it from running
// beside a server: a server still running on the database is found by its live-events connection and named, and
// nothing moves. Then the command, run as its own process as an operator runs it, is killed with SIGKILL half-way
// through a blob (its link to the bucket stops part-way: a TCP relay in front of s3rver), and the
// re-run continues that blob from its last checkpointed part, switches every row, and the bucket holds the right
// bytes.

const MiB = 1 << 20;
const PART = 8 * MiB; // the store's default part: what a checkpoint covers
const BIG = bytes(3 * PART + 12345, 31);
const SMALL = Buffer.from('{"model_type":"llama"}');
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const MIGRATE_MAIN = path.resolve(import.meta.dirname, '../src/mirror/migrate-main.ts');

let s3: S3Fixture;
let t: TestApp;
let sdk: S3Client;
let relay: { endpoint: string; close: () => Promise<void> };

/**
 * A TCP relay to s3rver that carries the first `budget` bytes of uploads and then holds the rest (a link to the
 * bucket that stops part-way): the command is certain to have checkpointed a part, and certain not to have finished
 * the blob, when it is killed — a slow link alone was outrun once on a loaded machine. Downloads are free.
 */
async function stallingLink(target: string, budget: number) {
  const to = new URL(target);
  let left = budget;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const up = net.connect(Number(to.port), to.hostname);
    for (const s of [client, up]) {
      sockets.add(s);
      s.once('close', () => {
        sockets.delete(s);
        client.destroy();
        up.destroy();
      });
      s.on('error', () => {});
    }
    up.pipe(client);
    client.on('data', (chunk: Buffer) => {
      if (left <= 0) return client.pause(); // held: never resumed, until the test closes the relay
      const passed = chunk.subarray(0, left);
      left -= passed.length;
      if (!up.destroyed) up.write(passed);
      if (left <= 0) client.pause();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

beforeAll(async () => {
  s3 = await startS3();
  useS3Env(s3);
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  relay = await stallingLink(s3.endpoint, PART + PART / 2);
  t = await startTestApp();
}, 60_000);

afterAll(async () => {
  await t?.close();
  await relay?.close();
  await s3?.close();
  sdk?.destroy();
});

describe('hangar mirror migrate beside running servers, and killed half-way', () => {
  it('refuses while a server runs on the database, naming it; killed with SIGKILL mid-blob, a re-run continues from the checkpoint and finishes, verified', async () => {
    const base = await t.app.start();
    const admin = await t.token('ADMIN', 'migrate-admin');
    for (const [file, body] of [
      ['config.json', SMALL],
      ['weights.bin', BIG],
    ] as const) {
      const put = await fetch(`${base}/mirror/moving/v1/${file}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(body) },
        body: new Uint8Array(body),
      });
      expect(put.status, file).toBe(201);
    }
    const db = t.app.db.prisma;
    const fileStorage = (await db.mirrorFile.findFirst({ where: { model: 'moving' } }))?.storageId;
    const spec = `s3://${s3.bucket}/mirror`;
    const env = {
      ...process.env,
      ...s3.env,
      DATABASE_URL: t.app.db.url,
      HANGAR_DATA_DIR: t.dataDir,
      HANGAR_LOG_LEVEL: 'silent',
      HANGAR_S3_FORCE_PATH_STYLE: 'true',
    };
    const lines: string[] = [];
    const print = (l: string) => lines.push(l);
    const listed = async () =>
      ((await sdk.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: 'mirror/blobs/' }))).Contents ?? []).map(
        (o) => path.basename(o.Key as string),
      );

    // The server is still running: refused, naming it, before a byte moves.
    expect(await runMirrorMigrate(['--to', spec], { env, print })).toBe(2);
    expect(lines.at(-1)).toMatch(
      /not moved: a Hangar server is still running on this database: connected from 127\.0\.0\.1:\d+ since \d{4}-.*Stop every server .*DATABASE_URL.*Nothing was changed\./,
    );
    expect(await listed()).toEqual([]);
    expect(await db.mirrorUpload.count()).toBe(0);

    // Stopped; the command runs as its own process over a link that stops after a part and a half, and is killed
    // once a part is checkpointed.
    await t.app.stop();
    const writeId = `migrate-${sha256(BIG)}`;
    const proc: ChildProcess = spawn(
      process.execPath,
      ['--import', 'tsx', MIGRATE_MAIN, 'mirror', 'migrate', '--to', spec],
      { env: { ...env, AWS_ENDPOINT_URL: relay.endpoint }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    proc.stdout?.on('data', (d) => (out += d));
    proc.stderr?.on('data', (d) => (out += d));
    const exited = new Promise<NodeJS.Signals | number | null>((r) => proc.once('exit', (code, sig) => r(sig ?? code)));
    let kept = 0;
    const deadline = Date.now() + 90_000;
    while (kept < PART && proc.exitCode === null && Date.now() < deadline) {
      await sleep(25);
      kept = Number((await db.mirrorUpload.findUnique({ where: { id: writeId } }))?.bytesDone ?? 0);
    }
    const reached = kept >= PART && proc.exitCode === null;
    proc.kill('SIGKILL');
    expect(await exited, out).toBe('SIGKILL');
    expect(reached, out).toBe(true);
    kept = Number((await db.mirrorUpload.findUnique({ where: { id: writeId } }))?.bytesDone ?? 0);
    expect(kept).toBeGreaterThanOrEqual(PART);
    expect(kept).toBeLessThan(BIG.length);
    // Nothing switched: the rows are on the `file` storage, unaudited; the small blob was copied already.
    expect(await db.mirrorFile.count({ where: { model: 'moving', storageId: fileStorage } })).toBe(2);
    expect(await db.auditEvent.count({ where: { action: 'migrateMirror' } })).toBe(0);
    expect(await listed()).toEqual([sha256(SMALL)]);

    // The re-run (the link is fine now) continues the big blob at its checkpoint and switches every row.
    lines.length = 0;
    expect(await runMirrorMigrate(['--to', spec], { env, print }), lines.join('\n')).toBe(0);
    expect(lines.join('\n')).toMatch(/in the bucket already: moving\/v1\/config.json/);
    expect(lines.join('\n')).toContain(
      `copied moving/v1/weights.bin (${sha256(BIG).slice(0, 12)}…, ${BIG.length} bytes, continued at ${kept})`,
    );
    expect((await listed()).sort()).toEqual([sha256(SMALL), sha256(BIG)].sort());
    const got = await sdk.send(
      new GetObjectCommand({ Bucket: s3.bucket, Key: `mirror/blobs/sha256/${sha256(BIG).slice(0, 2)}/${sha256(BIG)}` }),
    );
    expect(
      sha256(Buffer.from(await (got.Body as { transformToByteArray(): Promise<Uint8Array> }).transformToByteArray())),
    ).toBe(sha256(BIG));
    const rows = await db.mirrorFile.findMany({ where: { model: 'moving' } });
    expect(new Set(rows.map((r) => r.storageId)).size).toBe(1);
    expect(rows[0]?.storageId).not.toBe(fileStorage);
    expect(await db.mirrorUpload.count()).toBe(0);
    expect(await db.auditEvent.count({ where: { action: 'migrateMirror', outcome: 'DONE' } })).toBe(1);
  }, 150_000);
});
