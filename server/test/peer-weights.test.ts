import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import { sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// Weights node to node, with real agents on loopback (llama.cpp on the CPU, GPUs declared) against the real
// server and its mirror: nodes starting one model at once take it from the mirror about once in total, the rest
// from one another, each file checked against its sha256; and a node whose peer is killed mid-transfer finishes
// from another source, resuming. Each agent's downloads are rate-limited (HANGAR_AGENT_TRANSFER_RATE), as a
// node's link is, so that transfers overlap and a kill lands mid-way.

const MiB = 1 << 20;
const AGENT_BIN = path.resolve(import.meta.dirname, '../../packages/agent/bin/hangar-agent.mjs');

let t: TestApp;
let base: string;
let admin: string;
let operator: string;
let dir: string;
let model: Buffer;
let sha: string;
const agents: Agent[] = [];
const children: ChildProcess[] = [];

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  admin = await t.token('ADMIN', 'peer-admin');
  operator = await t.token('OPERATOR', 'peer-ops');
  model = tinyLlama();
  sha = sha256(model);
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha },
    body: new Uint8Array(model),
  });
  expect(put.status).toBe(201);
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-peers-'));
}, 60_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  await Promise.all(agents.map((a) => a.stop().catch(() => {})));
  await t?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

async function gql(query: string, token = operator) {
  const r = await t.gql(query, {}, { token });
  expect(r.errors).toBeUndefined();
  return r.data as Record<string, any>;
}

async function newNode(name: string): Promise<string> {
  const created = await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`, admin);
  return created.createNode.token;
}

function agentEnv(name: string, token: string, rate: number): Record<string, string> {
  return {
    HANGAR_URL: base,
    HANGAR_NODE_TOKEN: token,
    HANGAR_AGENT_DIR: path.join(dir, name),
    HANGAR_AGENT_THREADS: '1',
    HANGAR_AGENT_POLL_MS: '200',
    HANGAR_AGENT_HEARTBEAT_MS: '500',
    HANGAR_AGENT_TRANSFER_RATE: String(rate),
    HANGAR_LOG_LEVEL: 'warn',
  };
}

async function startAgent(name: string, rate: number, gpus = true) {
  const env = agentEnv(name, await newNode(name), rate);
  if (gpus) env.HANGAR_AGENT_GPUS = '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]';
  const agent = createAgent(loadAgentConfig(env), { log: createLogger('warn') });
  agents.push(agent);
  await agent.start();
  return agent;
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

/** /metrics as Prometheus reads it, with the operator's token. */
async function scrape(): Promise<string> {
  const res = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${operator}` } });
  expect(res.status).toBe(200);
  return res.text();
}

function series(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const out: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    const m = line.match(/^(\w+)(?:\{([^}]*)\})? (\S+)$/);
    if (!m || m[1] !== name) continue;
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    out.push({ labels: labels as Record<string, string>, value: Number(m[3]) });
  }
  return out;
}

/** Each node's bytes by source, as /metrics has them. */
async function bytesBySource(nodes: string[]) {
  const text = await scrape();
  const rows = series(text, 'hangar_node_download_bytes_total');
  const of = (node: string, source: string) =>
    rows.find((r) => r.labels.node === node && r.labels.source === source)?.value ?? 0;
  return {
    nodes: Object.fromEntries(nodes.map((n) => [n, { mirror: of(n, 'mirror'), peer: of(n, 'peer') }])),
    mirrorSent: series(text, 'hangar_mirror_sent_bytes_total')[0]?.value ?? 0,
  };
}

async function fileSha(file: string) {
  return createHash('sha256')
    .update(await fs.readFile(file))
    .digest('hex');
}

const replicas = (name: string) =>
  t.app.db.prisma.replica.findMany({ where: { model: { name } }, include: { node: true } });

describe('weights node to node', () => {
  it('four agents starting a model at once fetch it from the mirror about once in total, each file verified', async () => {
    const names = ['peer-1', 'peer-2', 'peer-3', 'peer-4'];
    // 8 MiB/s each: the 17 MB model takes about two seconds per node, so the four fetches overlap.
    for (const n of names) await startAgent(n, 8 * MiB);
    const sentBefore = (await bytesBySource([])).mirrorSent;
    await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "peer-tiny", mode: ALWAYS, replicas: 4) { __typename ... on Error { message } } }`,
    );
    await t.app.services.fleet.place();
    await until('four READY replicas on four nodes', async () => {
      const rows = await replicas('peer-tiny');
      const ready = rows.filter((r) => r.state === 'READY');
      if (rows.some((r) => r.state === 'FAILED')) throw new Error(rows.map((r) => r.message).join('; '));
      return ready.length === 4 && new Set(ready.map((r) => r.node?.name)).size === 4;
    });
    // Each node's copy is the mirror's, byte for byte.
    for (const n of names) expect(await fileSha(path.join(dir, n, 'models', `${sha}.gguf`))).toBe(sha);
    // The agents report after each heartbeat: every node's bytes arrive at /metrics within a few.
    const seen = await until('every node’s bytes at /metrics', async () => {
      const b = await bytesBySource(names);
      return names.every((n) => (b.nodes[n]?.mirror ?? 0) + (b.nodes[n]?.peer ?? 0) >= model.length) && b;
    });
    const fromMirror = names.reduce((s, n) => s + (seen.nodes[n]?.mirror ?? 0), 0);
    const fromPeers = names.reduce((s, n) => s + (seen.nodes[n]?.peer ?? 0), 0);
    const detail = JSON.stringify(seen);
    // About one copy from the mirror for four nodes (without peers: four), the other three from one another.
    expect(fromMirror, detail).toBeGreaterThanOrEqual(model.length);
    expect(fromMirror, detail).toBeLessThan(1.5 * model.length);
    expect(fromPeers, detail).toBeGreaterThanOrEqual(2.5 * model.length);
    // The mirror's own count agrees: what it sent is what the nodes say they took from it.
    expect(seen.mirrorSent - sentBefore, detail).toBeLessThan(1.5 * model.length);
    expect(seen.mirrorSent - sentBefore, detail).toBeGreaterThanOrEqual(model.length);
  }, 180_000);

  it('a node whose peer is killed mid-transfer finishes from another source, resuming, and verifies the file', async () => {
    // The four nodes of the test before leave; one new node holds the file (its cache kept from an earlier run)
    // and is the only peer: an agent in a process of its own, so that it can be killed outright.
    await gql('mutation { setModelMode(name: "peer-tiny", mode: STOPPED) { __typename } }');
    await Promise.all(agents.splice(0).map((a) => a.stop()));
    const holderDir = path.join(dir, 'holder');
    await fs.mkdir(path.join(holderDir, 'models'), { recursive: true });
    await fs.writeFile(path.join(holderDir, 'models', `${sha}.gguf`), model);
    // Its uplink at 2 MiB/s: what the late node has when the holder dies is what the holder sent, not what a
    // loopback socket's buffers held (tens of MB).
    const holderEnv = {
      ...process.env,
      ...agentEnv('holder', await newNode('holder'), 2 * MiB),
      HANGAR_AGENT_GPUS: '',
    };
    const holder = spawn(process.execPath, [AGENT_BIN], { env: holderEnv, stdio: 'ignore' });
    children.push(holder);
    await until('the holder reports the file', async () => {
      const row = await t.app.db.prisma.nodeFile.findFirst({
        where: { sha256: sha, held: true, node: { name: 'holder' } },
      });
      return row && Date.now() - row.updatedAt.getTime() < 2000;
    });

    await startAgent('late', 2 * MiB);
    await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "peer-late", mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }`,
    );
    await t.app.services.fleet.place();
    const partial = path.join(dir, 'late', 'models', `${sha}.gguf.part`);
    await until('a quarter of the model from the holder', async () => {
      const st = await fs.stat(partial).catch(() => undefined);
      return (st?.size ?? 0) > model.length / 4;
    });
    holder.kill('SIGKILL');

    await until('the late node READY', async () => {
      const rows = await replicas('peer-late');
      if (rows.some((r) => r.state === 'FAILED')) throw new Error(rows.map((r) => r.message).join('; '));
      return rows.some((r) => r.state === 'READY' && r.node?.name === 'late');
    });
    expect(await fileSha(path.join(dir, 'late', 'models', `${sha}.gguf`))).toBe(sha);
    const seen = await until('the late node’s bytes at /metrics', async () => {
      const b = await bytesBySource(['late']);
      const late = b.nodes.late;
      return late && late.mirror + late.peer >= model.length && late;
    });
    // Part from the peer before it died, the rest from the mirror where the peer stopped: the whole file once.
    expect(seen.peer, JSON.stringify(seen)).toBeGreaterThan(model.length / 4);
    expect(seen.mirror, JSON.stringify(seen)).toBeGreaterThan(0);
    expect(seen.mirror + seen.peer, JSON.stringify(seen)).toBe(model.length);
  }, 180_000);
});
