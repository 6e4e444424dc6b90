import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { sleep } from '@hangar/common/retry';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type S3Fixture, startS3, useS3Env } from './fixtures/s3.js';
import { startTestApp, type TestApp } from './harness.js';

// Nodes fetching straight from the bucket: a server on s3rver with HANGAR_S3_PRESIGN=on answers the real agent's
// GET /mirror/… with a 302 to a presigned URL, the agent (its own process, as on a GPU node) follows it and checks
// the file's sha256 before llama.cpp loads it. In front of s3rver an HTTP relay notes every request, so the test
// sees the bytes come from the bucket (a GET signed in its query, which only a presigned URL carries) and not
// through Hangar. An object changed in the bucket (same size, other bytes) is refused by the agent's own check.
// Run with the agent's weights node to node on (the default: the agent asks the mirror's HEAD for the sha256
// first) and off (it takes the sha256 from the answer it follows).

const AGENT_BIN = path.resolve(import.meta.dirname, '../../packages/agent/bin/hangar-agent.mjs');

let s3: S3Fixture;
let t: TestApp;
let base: string;
let admin: string;
let dir: string;
let sdk: S3Client;
let model: Buffer;
let sha: string;
let relay: { endpoint: string; seen: { method: string; url: string }[]; close: () => Promise<void> };
const children: ChildProcess[] = [];

/** An HTTP relay to s3rver that notes each request's method and URL (the AWS SDK and presigned URLs alike). */
async function notingRelay(target: string) {
  const to = new URL(target);
  const seen: { method: string; url: string }[] = [];
  const server = http.createServer((req, res) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '' });
    const up = http.request(
      { host: to.hostname, port: to.port, method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

beforeAll(async () => {
  s3 = await startS3();
  relay = await notingRelay(s3.endpoint);
  useS3Env(s3);
  process.env.AWS_ENDPOINT_URL = relay.endpoint;
  sdk = new S3Client({ endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true });
  t = await startTestApp({
    HANGAR_MIRROR_STORE: `s3://${s3.bucket}/mirror`,
    HANGAR_S3_FORCE_PATH_STYLE: 'true',
    HANGAR_S3_PRESIGN: 'on',
  });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'presign-admin');
  model = tinyLlama();
  sha = createHash('sha256').update(model).digest('hex');
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha },
    body: new Uint8Array(model),
  });
  expect(put.status).toBe(201);
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-presigned-'));
}, 60_000);

/** The agent killed outright (its llama.cpp follows it: parent-watch.ts), once it has exited. */
async function stopped(c: ChildProcess) {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const exited = new Promise((r) => c.once('exit', r));
  c.kill('SIGKILL');
  await exited;
}

afterAll(async () => {
  for (const c of children) await stopped(c);
  await t?.close();
  await relay?.close();
  await s3?.close();
  sdk?.destroy();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
}, 60_000);

async function gql(query: string) {
  const r = await t.gql(query, {}, { token: admin });
  expect(r.errors).toBeUndefined();
  return r.data as Record<string, any>;
}

async function until<T>(what: string, check: () => Promise<T | undefined | false>, ms = 90_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(200);
  }
}

const key = () => `mirror/blobs/sha256/${sha.slice(0, 2)}/${sha}`;
const presignedGets = () =>
  relay.seen.filter((r) => r.method === 'GET' && r.url.includes(key()) && r.url.includes('X-Amz-Signature='));
const replicaOf = async (name: string) =>
  (await t.app.db.prisma.replica.findMany({ where: { model: { name } } }))[0] ?? null;

describe.each([
  ['on', 'asks the HEAD first'],
  ['off', 'takes the sha256 from the redirect'],
])('the real agent on presigned URLs (HANGAR_AGENT_PEERS=%s: %s)', (peers) => {
  it('follows /mirror’s 302 to the bucket, checks the sha256, and refuses an object changed in the bucket', async () => {
    const node = `presigned-${peers}`;
    const token = (await gql(`mutation { createNode(name: "${node}") { ... on CreatedNode { token } } }`)).createNode
      .token as string;
    const agentDir = path.join(dir, node);
    const agent = spawn(process.execPath, [AGENT_BIN], {
      env: {
        ...process.env,
        HANGAR_URL: base,
        HANGAR_NODE_TOKEN: token,
        HANGAR_AGENT_DIR: agentDir,
        HANGAR_AGENT_THREADS: '1',
        HANGAR_AGENT_POLL_MS: '200',
        HANGAR_AGENT_HEARTBEAT_MS: '500',
        HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
        HANGAR_AGENT_PEERS: peers,
        HANGAR_LOG_LEVEL: 'warn',
      },
      stdio: 'ignore',
    });
    children.push(agent);
    await until(
      'the node online',
      async () => (await t.app.db.prisma.node.findUnique({ where: { name: node } }))?.lastSeenAt,
    );

    // The object in the bucket is changed behind Hangar's back: same size, one byte other.
    const good = Buffer.from(
      await (
        (await sdk.send(new GetObjectCommand({ Bucket: s3.bucket, Key: key() }))).Body as {
          transformToByteArray(): Promise<Uint8Array>;
        }
      ).transformToByteArray(),
    );
    expect(good.equals(model)).toBe(true);
    const bad = Buffer.from(good);
    bad[bad.length - 100] = (bad[bad.length - 100] as number) ^ 0xff;
    await sdk.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key(), Body: bad }));
    const before = presignedGets().length;
    await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "bad-${peers}", mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }`,
    );
    await t.app.services.fleet.place();
    const failed = await until('the replica refused', async () => {
      const r = await replicaOf(`bad-${peers}`);
      return r?.state === 'FAILED' && r;
    });
    expect(failed.message).toMatch(new RegExp(`sha256 .*${sha}|${sha}.*sha256`));
    expect(presignedGets().length).toBeGreaterThan(before);
    const cached = async () => fs.readdir(path.join(agentDir, 'models')).catch(() => [] as string[]);
    expect(await cached()).not.toContain(`${sha}.gguf`);
    await gql(`mutation { setModelMode(name: "bad-${peers}", mode: STOPPED) { __typename } }`);

    // The right bytes back: the agent fetches them from the bucket, verified, and llama.cpp serves them.
    await sdk.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key(), Body: good }));
    const fromBucket = presignedGets().length;
    await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "good-${peers}", mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }`,
    );
    await t.app.services.fleet.place();
    await until('the replica READY', async () => {
      const r = await replicaOf(`good-${peers}`);
      if (r?.state === 'FAILED') throw new Error(r.message ?? 'FAILED');
      return r?.state === 'READY';
    });
    expect(presignedGets().length).toBeGreaterThan(fromBucket);
    const held = await fs.readFile(path.join(agentDir, 'models', `${sha}.gguf`));
    expect(createHash('sha256').update(held).digest('hex')).toBe(sha);
    await gql(`mutation { setModelMode(name: "good-${peers}", mode: STOPPED) { __typename } }`);
    await stopped(agent);
  }, 150_000);
});
