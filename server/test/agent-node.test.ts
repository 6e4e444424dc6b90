import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { ControlPlaneError, GraphqlControlPlane } from '@hangar/agent/control-plane';
import { onPath } from '@hangar/agent/inventory';
import { ModelCache } from '@hangar/agent/model-cache';
import { createLogger } from '@hangar/common/log';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeAdapterDir } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// The agent against the real server: its heartbeat over HTTP with a node token, a model fetched from the real
// mirror (ETag = sha256, node token accepted), and a replica placed by the real placement pass, run to READY by
// llama.cpp on CPU and stopped again. The runner's corner cases are in runner.test.ts, with a stand-in.

let t: TestApp;
let base: string;
let nodeToken: string;
let admin: string;
let dir: string;
const tiny = tinyLlama();

beforeAll(async () => {
  // HANGAR_MIRROR_REQUIRE_TOKEN is on (the default): the agent sends its node token, the serve flow's HEAD check
  // of the source the server's own.
  t = await startTestApp();
  base = await t.app.start();
  admin = await t.token('ADMIN', 'agent-admin');
  const created = await t.gql(
    'mutation { createNode(name: "cpu-1") { ... on CreatedNode { token } } }',
    {},
    { token: admin },
  );
  nodeToken = created.data?.createNode.token;
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(tiny) },
    body: new Uint8Array(tiny),
  });
  expect(put.status).toBe(201);
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-agent-'));
});
afterAll(async () => {
  await t.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('the agent and the real server', () => {
  it('reports the node with its heartbeat, and keeps going when an operation is refused', async () => {
    const lines: string[] = [];
    const config = loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: nodeToken,
      HANGAR_AGENT_DIR: dir,
      HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
      HANGAR_AGENT_THREADS: '1',
    });
    const agent = createAgent(config, { log: createLogger('info', (l) => lines.push(l)) });
    await agent.start();
    await agent.heartbeat();

    const nodes = await t.gql(
      '{ nodes { name online agentVersion diskFreeBytes gpus { name totalMiB } engines { name version build } } }',
      {},
      { token: admin },
    );
    const node = nodes.data?.nodes[0];
    expect(node).toMatchObject({ name: 'cpu-1', online: true, agentVersion: '0.1.0' });
    // Stopped, it says it is leaving: offline at once, not 30 s later.
    await agent.stop();
    expect((await t.gql('{ nodes { online } }', {}, { token: admin })).data?.nodes).toEqual([{ online: false }]);
    expect(node.diskFreeBytes).toBeGreaterThan(0);
    if (!(await onPath('nvidia-smi', config.searchPath)))
      expect(node.gpus).toEqual([{ name: 'RTX 4090', totalMiB: 24564 }]);
    expect(node.engines).toContainEqual({ name: 'llama.cpp', version: expect.any(String), build: expect.any(Number) });
    // Whatever the server says about assignments, the agent logs it and carries on; it never logs its token.
    expect(lines.join('\n')).not.toContain(nodeToken);
  });

  it('runs the replica the control plane places on it, and stops it when the model is stopped', async () => {
    const operator = await t.token('OPERATOR', 'agent-ops');
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "tiny", context: 1024) { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
    const config = loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: nodeToken,
      HANGAR_AGENT_DIR: path.join(dir, 'e2e'),
      HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_LOG_LEVEL: 'silent',
    });
    const agent = createAgent(config, { log: createLogger('silent') });
    const replicas = async () =>
      (
        await t.gql(
          '{ model(name: "tiny") { replicas { state message smokeText tokensPerSecond node { name } } } }',
          {},
          { token: operator },
        )
      ).data?.model.replicas;
    const until = async (state: string) => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const now = await replicas();
        if (now?.[0]?.state === state) return now[0];
        if (Date.now() > deadline) throw new Error(`the replica is ${JSON.stringify(now)}, not ${state}`);
        await t.app.services.fleet.place();
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    try {
      await agent.start();
      const ready = await until('READY');
      expect(ready).toMatchObject({ node: { name: 'cpu-1' }, smokeText: expect.any(String) });
      expect(ready.tokensPerSecond).toBeGreaterThan(0);
      // The catalog asked for 1024; the model was trained on 512, and more would only degrade it.
      expect(ready.message).toMatch(/512-token context/);

      const stop = await t.gql(
        'mutation { setModelMode(name: "tiny", mode: STOPPED) { __typename ... on Error { message } } }',
        {},
        { token: operator },
      );
      expect(stop.data?.setModelMode).toEqual({ __typename: 'Model' });
      // Stopped by its agent: the row says so, and the model lists no replica (a stopped one is history).
      const deadline = Date.now() + 20_000;
      while ((await t.app.db.prisma.replica.findFirst({ where: { model: { name: 'tiny' } } }))?.state !== 'STOPPED') {
        if (Date.now() > deadline) throw new Error('the replica did not stop');
        await t.app.services.fleet.place();
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(await replicas()).toEqual([]);
      // Reported and no longer assigned: the agent lets it go.
      await agent.runner.poll();
      expect(agent.runner.snapshot()).toEqual([]);
    } finally {
      await agent.stop();
    }
  });

  it('loads an adapter published while its replica runs, and the control plane learns which adapters it holds', async () => {
    const operator = await t.token('OPERATOR', 'agent-adapters');
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "tiny-follow") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
    const from = await writeAdapterDir();
    const lora = peftToGguf({
      config: JSON.parse(await fs.readFile(path.join(from, 'adapter_config.json'), 'utf8')),
      safetensors: await fs.readFile(path.join(from, 'adapter_model.safetensors')),
      base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
    });
    await fs.rm(from, { recursive: true, force: true });
    const put = await fetch(`${base}/mirror/tiny-follow-lora/v1/adapter.gguf`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(lora) },
      body: new Uint8Array(lora),
    });
    expect(put.status).toBe(201);
    const config = loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: nodeToken,
      HANGAR_AGENT_DIR: path.join(dir, 'adapters'),
      HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_LOG_LEVEL: 'silent',
    });
    const agent = createAgent(config, { log: createLogger('silent') });
    type Seen = { state: string; message: string | null; adapters: string[] };
    const until = async (check: (r: Seen) => boolean, what: string) => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const now = (
          await t.gql('{ model(name: "tiny-follow") { replicas { state message adapters } } }', {}, { token: operator })
        ).data?.model.replicas?.[0] as Seen | undefined;
        if (now && check(now)) return now;
        if (Date.now() > deadline) throw new Error(`${what}: the replica is ${JSON.stringify(now)}`);
        await t.app.services.fleet.place();
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    try {
      await agent.start();
      expect(await until((r) => r.state === 'READY', 'READY')).toMatchObject({ adapters: [] });
      // Published as publishTrainJob does: a catalog row whose source is the file in the mirror.
      const model = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'tiny-follow' } });
      await t.app.db.prisma.adapter.create({
        data: {
          name: 'tiny-follow-lora',
          source: `${base}/mirror/tiny-follow-lora/v1/adapter.gguf`,
          modelId: model.id,
        },
      });
      const loaded = await until((r) => r.adapters.includes('tiny-follow-lora'), 'the adapter reported');
      expect(loaded.state).toBe('READY');
      expect(loaded.message).toMatch(/; adapters: tiny-follow-lora \(\d+ tokens\)$/);

      await t.app.db.prisma.adapter.delete({ where: { name: 'tiny-follow-lora' } });
      const gone = await until((r) => r.adapters.length === 0, 'the adapter no longer reported');
      expect(gone.state).toBe('READY');
      expect(gone.message).not.toMatch(/adapters/);
    } finally {
      await agent.stop();
      await t.gql(
        'mutation { setModelMode(name: "tiny-follow", mode: STOPPED) { __typename } }',
        {},
        { token: operator },
      );
    }
  });

  it('fetches a model from the mirror and checks it against the ETag', async () => {
    const cache = new ModelCache(dir, { auth: { origin: new URL(base).origin, token: nodeToken } });
    const got = await cache.fetch(`${base}/mirror/tiny-llama/v1/model.gguf`);
    expect(got).toMatchObject({ sha256: sha256(tiny), bytes: tiny.length, reused: false });
    await expect(cache.fetch(`${base}/mirror/tiny-llama/v1/absent.gguf`)).rejects.toThrow(/answered 404: no such file/);
  });

  it('tells a refused token from a control plane that is not there', async () => {
    const refused = await new GraphqlControlPlane(base, 'hgn_not-a-real-token')
      .reportNode({ gpus: [], engines: [], diskFreeBytes: null, agentVersion: 'x' })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ControlPlaneError);
    expect(refused).toMatchObject({ kind: 'refused' });
    // A port nothing listens on: what a node sees while the control plane restarts.
    const closed = http.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const { port } = closed.address() as AddressInfo;
    await new Promise((r) => closed.close(r));
    const down = await new GraphqlControlPlane(`http://127.0.0.1:${port}`, nodeToken, { timeoutMs: 2000 })
      .assignments()
      .catch((e: unknown) => e);
    expect(down).toBeInstanceOf(ControlPlaneError);
    expect((down as ControlPlaneError).kind).toBe('unreachable');
    expect((down as Error).message).toMatch(/did not answer: ECONNREFUSED/);
  });
});
