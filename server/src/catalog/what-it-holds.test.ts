import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { gguf } from '@hangar/common/test/fixtures/gguf-writer';
import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { modeMessage } from './catalog.service.js';

// What a mirrored version holds (read from its headers, never its name), and what the catalog says about a model:
// where a declared one is changed, what a mode change does next, and the live events the Models page follows.

let t: TestApp;
let base: string;
let operator: string;
let yaml: string;
const vocab = new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url);

/** A LoRA adapter's header, as Hangar's own converter (train/gguf-adapter.ts) and llama.cpp's write it. */
const adapterFile = () =>
  gguf(
    [
      ['general.architecture', 'str', 'llama'],
      ['general.type', 'str', 'adapter'],
      ['adapter.type', 'str', 'lora'],
      ['adapter.lora.alpha', 'f32', 16],
    ],
    [
      { name: 'blk.0.attn_q.weight.lora_a', dims: [64, 4], type: 0 },
      { name: 'blk.0.attn_q.weight.lora_b', dims: [4, 64], type: 0 },
    ],
  ).header;

const put = async (where: string, body: Buffer) => {
  const r = await fetch(`${base}/mirror/${where}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${operator}` },
    body: new Uint8Array(body),
  });
  expect(r.status).toBe(201);
};

beforeAll(async () => {
  yaml = path.join(await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-yaml-')), 'hangar.yaml');
  await fs.writeFile(
    yaml,
    'models:\n  - name: first-declared\n    source: http://mirror.example/mirror/a/v1/a.gguf\n    engine: llamacpp\n  - name: chat-declared\n    source: http://mirror.example/mirror/b/v1/b.gguf\n    engine: llamacpp\n    mode: ON_DEMAND\n',
  );
  t = await startTestApp({ HANGAR_CONFIG: yaml });
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'holds-ops');
  await put('lora-chat/job-1/lora-chat.gguf', adapterFile());
  // A llama whose name says "imatrix": quantised with an importance matrix, a model all the same.
  await put('llama-imx/v1/llama-7b-imatrix-Q4_K_M.gguf', await fs.readFile(vocab));
});
afterAll(() => t.close());

const PLAN = `query($m: String!, $v: String!) { servePlan(model: $m, version: $v) { __typename
  ... on ServePlan { engine architecture servable } ... on Error { message } } }`;
const SERVE = `mutation($m: String!, $v: String!, $n: String, $mode: ModelMode, $r: Int) {
  serveMirrorVersion(model: $m, version: $v, name: $n, mode: $mode, replicas: $r) { __typename
  ... on ServePlaced { model { name } } ... on Error { message } } }`;
const VERSION = `query($m: String!, $v: String!) { mirrorVersion(model: $m, version: $v) { kind architecture
  usedBy { name mode replicas maxReplicas adapterOf } } }`;
const MODE = `mutation($n: String!, $mode: ModelMode!, $r: Int) { setModelMode(name: $n, mode: $mode, replicas: $r) {
  __typename ... on Model { mode modeMessage } ... on Error { message } } }`;

describe('what a mirrored version holds', () => {
  it('is read from the header: an adapter is ADAPTER for its base, a llama named "imatrix" is a model', async () => {
    const adapter = await t.gql(VERSION, { m: 'lora-chat', v: 'job-1' }, { token: operator });
    expect(adapter.data?.mirrorVersion).toMatchObject({ kind: 'ADAPTER', architecture: 'llama' });
    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'lora-chat' } });
    expect(row).toMatchObject({ kind: 'ADAPTER', architecture: 'llama' });
    const model = await t.gql(VERSION, { m: 'llama-imx', v: 'v1' }, { token: operator });
    expect(model.data?.mirrorVersion).toMatchObject({ kind: 'MODEL', architecture: 'llama' });
    // Judged by its header, not its name: served by llama.cpp, not taken for a vLLM directory.
    const plan = await t.gql(PLAN, { m: 'llama-imx', v: 'v1' }, { token: operator });
    expect(plan.data?.servePlan).toMatchObject({ __typename: 'ServePlan', engine: 'llamacpp', servable: true });
  });

  it('is read once for a file verified before kinds were kept, and stored', async () => {
    await t.app.db.prisma.mirrorFile.updateMany({
      where: { model: 'llama-imx' },
      data: { kind: null, architecture: null },
    });
    const r = await t.gql(VERSION, { m: 'llama-imx', v: 'v1' }, { token: operator });
    expect(r.data?.mirrorVersion.kind).toBe('MODEL');
    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'llama-imx' } });
    expect(row).toMatchObject({ kind: 'MODEL', architecture: 'llama' });
  });

  it('refuses to serve an adapter as a model, with the reason, and changes nothing', async () => {
    const before = await t.app.db.prisma.catalogModel.count();
    const plan = await t.gql(PLAN, { m: 'lora-chat', v: 'job-1' }, { token: operator });
    expect(plan.data?.servePlan).toEqual({
      __typename: 'ConflictError',
      message:
        "lora-chat/job-1: this version holds a LoRA adapter for llama, not a model's weights: publish it to its model instead (the training job's Publish), or attach it to a model in the catalog",
    });
    const served = await t.gql(SERVE, { m: 'lora-chat', v: 'job-1' }, { token: operator });
    expect(served.data?.serveMirrorVersion.__typename).toBe('ConflictError');
    expect(await t.app.db.prisma.catalogModel.count()).toBe(before);

    // Attached to a model, it names the models it belongs to.
    const placed = await t.gql(
      SERVE,
      { m: 'llama-imx', v: 'v1', n: 'llama-host', mode: 'STOPPED' },
      { token: operator },
    );
    expect(placed.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const host = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'llama-host' } });
    await t.app.db.prisma.adapter.create({
      data: { name: 'lora-chat', source: `${base}/mirror/lora-chat/job-1/lora-chat.gguf`, modelId: host.id },
    });
    const again = await t.gql(PLAN, { m: 'lora-chat', v: 'job-1' }, { token: operator });
    expect(again.data?.servePlan.message).toBe(
      "lora-chat/job-1: this version holds a LoRA adapter for llama-host, not a model's weights: it is already attached to llama-host: call it by its name there",
    );
    const used = await t.gql(VERSION, { m: 'lora-chat', v: 'job-1' }, { token: operator });
    expect(used.data?.mirrorVersion.usedBy).toEqual([
      { name: 'lora-chat', mode: 'STOPPED', replicas: 0, maxReplicas: 0, adapterOf: 'llama-host' },
    ]);
  });
});

describe('what the catalog says of a model', () => {
  it('says where a declared model is changed: the file and its entry', async () => {
    const r = await t.gql('{ models { name declared declaredIn { file key } } }', {}, { token: operator });
    const chat = r.data?.models.find((m: { name: string }) => m.name === 'chat-declared');
    expect(chat).toEqual({ name: 'chat-declared', declared: true, declaredIn: { file: yaml, key: 'models.1' } });
    const refused = await t.gql(MODE, { n: 'chat-declared', mode: 'ALWAYS' }, { token: operator });
    expect(refused.data?.setModelMode.message).toBe(
      `chat-declared is declared in ${yaml} (models.1, name: chat-declared): change it there; it is read at every start`,
    );
  });

  it('answers a mode change with what happens next', async () => {
    const served = await t.gql(
      SERVE,
      { m: 'llama-imx', v: 'v1', n: 'llama-modes', mode: 'STOPPED' },
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const always = await t.gql(MODE, { n: 'llama-modes', mode: 'ALWAYS', r: 2 }, { token: operator });
    expect(always.data?.setModelMode).toEqual({
      __typename: 'Model',
      mode: 'ALWAYS',
      modeMessage: 'always: 2 replicas are being placed',
    });
    const m = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'llama-modes' } });
    // One serving on a node that is online: its agent must stop it, so it runs until the agent says it stopped.
    const node = await t.app.db.prisma.node.create({
      data: { name: 'modes-node', tokenHash: 'modes-node-token-hash', lastSeenAt: new Date() },
    });
    await t.app.db.prisma.replica.create({ data: { modelId: m.id, nodeId: node.id, state: 'READY' } });
    const stopped = await t.gql(MODE, { n: 'llama-modes', mode: 'STOPPED' }, { token: operator });
    // Answered after the pass: the two placed ones, on no node, are stopped at once; the serving one is going.
    expect(stopped.data?.setModelMode.modeMessage).toBe('stopped; its replicas are being taken down (1 still running)');
    await t.app.db.prisma.replica.deleteMany({ where: { modelId: m.id } });
    await t.app.db.prisma.node.delete({ where: { id: node.id } });
    await t.app.db.prisma.catalogModel.update({ where: { id: m.id }, data: { idleSeconds: 600 } });
    const onDemand = await t.gql(MODE, { n: 'llama-modes', mode: 'ON_DEMAND', r: 3 }, { token: operator });
    // A placement pass begun while the model was ALWAYS may have placed a replica after the delete, so the words
    // for one running are accepted too (both wordings are pinned in the modeMessage test below).
    expect(onDemand.data?.setModelMode.modeMessage).toMatch(
      /^on demand: (starts when a request asks for it, stops after 10 minutes unused|running now; stops after 10 minutes unused, and starts again when a request asks for it)$/,
    );
    // The mirror's "used by" says how many it may run, not the 0 an idle on-demand model keeps.
    const used = await t.gql(VERSION, { m: 'llama-imx', v: 'v1' }, { token: operator });
    expect(used.data?.mirrorVersion.usedBy).toContainEqual({
      name: 'llama-modes',
      mode: 'ON_DEMAND',
      replicas: 0,
      maxReplicas: 3,
      adapterOf: null,
    });
  });

  it('sends every change of a model, its replicas and its removal to modelChanged subscribers', async () => {
    const served = await t.gql(
      SERVE,
      { m: 'llama-imx', v: 'v1', n: 'llama-live', mode: 'STOPPED' },
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const m = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'llama-live' } });
    type Seen = { name: string; mode: string; idleSeconds: number; adapters: { name: string }[] };
    const seen: { modelId: string; model: Seen | null }[] = [];
    const client = createClient({
      url: `${base.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${operator}` },
    });
    let subscribed!: () => void;
    const acked = new Promise<void>((r) => {
      subscribed = r;
    });
    client.on('connected', () => subscribed());
    const stop = client.subscribe(
      { query: 'subscription { modelChanged { modelId model { name mode idleSeconds adapters { name } } } }' },
      { next: (msg) => seen.push((msg.data as any).modelChanged), error: () => {}, complete: () => {} },
    );
    const mine = () => seen.filter((e) => e.modelId === m.id);
    try {
      await acked;
      await new Promise((r) => setTimeout(r, 200)); // the subscription is registered once the socket is up
      const r = await t.gql(MODE, { n: 'llama-live', mode: 'ON_DEMAND' }, { token: operator });
      expect(r.data?.setModelMode.mode).toBe('ON_DEMAND');
      await until(() => mine().some((e) => e.model?.mode === 'ON_DEMAND'));
      // Written by anything (here straight to the database, as placement or an agent's report is), it is an event.
      await t.app.db.prisma.catalogModel.update({ where: { id: m.id }, data: { idleSeconds: 1234 } });
      await until(() => mine().some((e) => e.model?.idleSeconds === 1234));
      await t.app.db.prisma.adapter.create({
        data: { name: 'live-adapter', source: `${base}/mirror/lora-chat/job-1/lora-chat.gguf`, modelId: m.id },
      });
      await until(() => mine().some((e) => e.model?.adapters.some((a) => a.name === 'live-adapter') ?? false));
      const removed = await t.gql(
        'mutation { removeModel(name: "llama-live") { __typename } }',
        {},
        { token: operator },
      );
      expect(removed.data?.removeModel.__typename).toBe('RemovedModel');
      await until(() => mine().some((e) => e.model === null));
    } finally {
      stop();
      await client.dispose();
    }
  });
});

async function until(check: () => boolean, ms = 5000) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('modeMessage', () => {
  const onDemand = { minReplicas: 0, maxReplicas: 3, idleSeconds: 600 };
  it('says what happens next for each mode, from the replicas as they are', () => {
    expect(modeMessage(onDemand, [])).toBe(
      'on demand: starts when a request asks for it, stops after 10 minutes unused',
    );
    expect(modeMessage(onDemand, [{ state: 'READY', desired: 'RUN' }])).toBe(
      'on demand: running now; stops after 10 minutes unused, and starts again when a request asks for it',
    );
    // One being stopped is not "running now".
    expect(modeMessage(onDemand, [{ state: 'READY', desired: 'STOP' }])).toBe(
      'on demand: starts when a request asks for it, stops after 10 minutes unused',
    );
    expect(
      modeMessage({ minReplicas: 0, maxReplicas: 0, idleSeconds: 600 }, [{ state: 'READY', desired: 'STOP' }]),
    ).toBe('stopped; its replicas are being taken down (1 still running)');
    expect(
      modeMessage({ minReplicas: 2, maxReplicas: 2, idleSeconds: 600 }, [{ state: 'READY', desired: 'RUN' }]),
    ).toBe('always: 2 replicas are being placed (1 ready)');
  });

  it('says a replica failed rather than "being placed" when nothing else is on its way', () => {
    const always = { minReplicas: 1, maxReplicas: 1, idleSeconds: 600 };
    expect(modeMessage(always, [{ state: 'FAILED', desired: 'RUN' }])).toBe(
      'always: 1 replica wanted, 0 ready; 1 failed (each replica says why)',
    );
    // A replacement on its way is being placed, whatever failed before it.
    expect(
      modeMessage(always, [
        { state: 'FAILED', desired: 'RUN' },
        { state: 'PENDING', desired: 'RUN' },
      ]),
    ).toBe('always: 1 replica is being placed');
  });
});
