import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { peftToGguf } from '@hangar/common/peft/gguf-adapter';
import { OpenAI, openAiClient, readChatStream } from '@hangar/common/test/fixtures/openai-client';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hashSecret, newSecret } from '../src/auth/secrets.js';
import { ownerKey } from '../src/org/org.service.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// The gateway end to end, as an application meets it: the official `openai` client on the control plane's /v1,
// a real node agent (its heartbeat, its runner, its own OpenAI endpoint) running real llama.cpp on the tiny
// random llama with the committed PEFT adapter (packages/common/test/fixtures/peft-h200, converted to GGUF by the server's
// converter and served from the mirror), placed by the real placement pass. One app and one agent for the file:
// every test shares them, so the tiny llama loads once per catalog model.
//
// Two replicas of one model need two nodes (placement puts one replica of a model per node), so the tests of
// load sharing and of a replica killed mid-answer use two stand-in replicas (test/fixtures/stand-in-replica.ts,
// real sockets speaking the protocol) on two nodes played over GraphQL, as src/fleet/serving.test.ts does: their
// model is a vLLM one and their nodes run only vLLM, so nothing of the llama.cpp fleet is placed on them.
//
// Rows a published training job would make (an adapter with an owner, a model with an owner) are inserted with
// Prisma: a training run here would take minutes and is tested in src/train/.

const FIXTURE = new URL('../../packages/common/test/fixtures/peft-h200/', import.meta.url).pathname;
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const KEY_A = 'hgk_gateway-e2e-stand-in-a-0123456789abcdef';
const KEY_B = 'hgk_gateway-e2e-stand-in-b-0123456789abcdef';
const PROMPT = 'The quick brown fox jumps over the lazy dog again';
const IDLE_SECONDS = 4;

let t: TestApp;
let base: string;
let admin: string;
let agent: Agent;
let dir: string;
let standA: StandInReplica;
let standB: StandInReplica;
let beat: NodeJS.Timeout | undefined;
const db = () => t.app.db.prisma;
const tokens = {} as Record<'member' | 'outsider' | 'usage', { secret: string; id: string }>;

/** A caller-only API token of `userId`, as the Tokens page makes one (the secret is only ever shown once). */
async function callerToken(name: string, userId: string) {
  const secret = newSecret('api');
  const row = await db().apiToken.create({
    data: {
      name,
      prefix: secret.slice(0, 8),
      tokenHash: hashSecret(secret),
      role: 'VIEWER',
      callerOnly: true,
      userId,
    },
  });
  return { secret, id: row.id };
}

const gql = async (query: string, variables: Record<string, unknown> = {}, token = admin) => {
  const r = await t.gql(query, variables, { token });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data as Record<string, any>;
};

const client = (secret: string) => openAiClient(base, secret, { timeoutMs: 90_000 });

async function until<T>(what: string, check: () => Promise<T | undefined | null | false>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const replicasOf = (model: string) =>
  db().replica.findMany({ where: { model: { name: model } }, include: { node: true }, orderBy: { createdAt: 'asc' } });

/** The in-process llama.cpp model the agent serves a replica with: its sequences generating now. */
function servedModel(replicaId: string) {
  // The runner keeps its replicas private; the test reads the one number the agent's endpoint does not show.
  const held = (agent.runner as unknown as { replicas: Map<string, { model?: { active: number; queued: number } }> })
    .replicas;
  const model = held.get(replicaId)?.model;
  if (!model) throw new Error(`the agent serves no replica ${replicaId}`);
  return model;
}

async function putMirror(file: string, body: Buffer) {
  const put = await fetch(`${base}/mirror/${file}`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(body) },
    body: new Uint8Array(body),
  });
  expect(put.status, await put.text()).toBe(201);
}

/** Plays a stand-in node's agent over GraphQL: a heartbeat saying it runs vLLM on a large GPU. */
const standInHeartbeat = (nodeToken: string) =>
  t.gql(
    'mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename } }',
    {
      i: {
        gpus: [{ index: 0, name: 'H200', totalMiB: 143_771, freeMiB: 140_000 }],
        engines: [{ name: 'vllm', version: '0.11.0' }],
      },
    },
    { token: nodeToken },
  );

let teamId: string;
let tinyReplicaId: string;
/** The stand-in nodes, as the test plays their agents. */
const standIns: { name: string; token: string; stand: StandInReplica; key: string; slot: 'a' | 'b' }[] = [];
const pair: Record<'a' | 'b', string> = { a: '', b: '' };

beforeAll(async () => {
  t = await startTestApp({ HANGAR_GATEWAY_WAKE_SECONDS: '90' });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'gateway-admin');
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-gateway-e2e-'));

  // The weights and the adapter, in the mirror as a fetch or a published job leaves them.
  await putMirror('tiny-llama/v1/model.gguf', tinyLlama());
  const adapter = peftToGguf({
    config: JSON.parse(await fs.readFile(path.join(FIXTURE, 'adapter_config.json'), 'utf8')),
    safetensors: await fs.readFile(path.join(FIXTURE, 'adapter_model.safetensors')),
    base: { architecture: 'llama', headCount: 4, headCountKv: 4 },
  });
  await putMirror('tiny-h200/v1/adapter.gguf', adapter);

  // The catalog: an always-on model with an adapter owned by a team, the same weights on demand, a model one
  // key owns, and one too large for any node.
  for (const [name, mode] of [
    ['tiny', 'ALWAYS'],
    ['tiny-od', 'ON_DEMAND'],
  ]) {
    const served = await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "${name}", context: 512, mode: ${mode}) { __typename ... on Error { message } } }`,
    );
    expect(served.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
  }
  // Small, so the test sees it stop (the default is 15 minutes, and no mutation sets it).
  await db().catalogModel.update({ where: { name: 'tiny-od' }, data: { idleSeconds: IDLE_SECONDS } });
  const tiny = await db().catalogModel.findUniqueOrThrow({ where: { name: 'tiny' } });

  await gql('mutation { createOrg(name: "acme") { __typename } }');
  const team = await gql('mutation { createTeam(org: "acme", name: "research") { __typename ... on Team { id } } }');
  teamId = team.createTeam.id;
  const member = await db().user.create({
    data: { email: 'member@acme.test', name: 'member', role: 'VIEWER', passwordHash: 'x' },
  });
  const outsider = await db().user.create({
    data: { email: 'outsider@elsewhere.test', name: 'outsider', role: 'VIEWER', passwordHash: 'x' },
  });
  const added = await gql(
    'mutation($i: AddMemberInput!) { addMember(input: $i) { __typename ... on Error { message } } }',
    { i: { org: 'acme', team: 'acme/research', user: member.id } },
  );
  expect(added.addMember.__typename).toBe('Membership');
  tokens.member = await callerToken('member-app', member.id);
  tokens.outsider = await callerToken('outsider-app', outsider.id);
  tokens.usage = await callerToken('usage-app', member.id);

  await db().adapter.create({
    data: {
      name: 'tiny-h200',
      source: `${base}/mirror/tiny-h200/v1/adapter.gguf`,
      owner: ownerKey({ scope: 'team', id: teamId }),
      modelId: tiny.id,
      artifactSha256: sha256(adapter),
    },
  });
  await db().catalogModel.create({
    data: {
      name: 'outsiders-model',
      source: tiny.source,
      engine: 'llamacpp',
      memoryBytes: tiny.memoryBytes,
      minReplicas: 0,
      maxReplicas: 1,
      owner: ownerKey({ scope: 'key', id: tokens.outsider.id }),
    },
  });
  await db().catalogModel.create({
    data: { name: 'huge', source: tiny.source, engine: 'llamacpp', memoryBytes: 2n ** 50n },
  });

  // The stand-in pair: two nodes running vLLM, one replica of "pair" each.
  standA = await startStandInReplica({ key: KEY_A });
  standB = await startStandInReplica({ key: KEY_B });
  for (const [name, stand, key, slot] of [
    ['stand-a', standA, KEY_A, 'a'],
    ['stand-b', standB, KEY_B, 'b'],
  ] as const) {
    const node = await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`);
    standIns.push({ name, token: node.createNode.token, stand, key, slot });
    await standInHeartbeat(node.createNode.token);
  }
  beat = setInterval(() => {
    for (const s of standIns) void standInHeartbeat(s.token);
  }, 5000);
  // Created once both nodes report: its event sets off a placement pass at once (fleet/placement-schedule.ts), which
  // with one node online would put both replicas there.
  await db().catalogModel.create({
    data: {
      name: 'pair',
      source: 'http://mirror.invalid/pair/v1/config.json',
      engine: 'vllm',
      memoryBytes: 2n ** 30n,
      minReplicas: 2,
      maxReplicas: 2,
      // The load-sharing tests below are of least-loaded routing; prefix routing is tested in prefix-routing.test.ts
      // (and here, where an overloaded replica sheds).
      routing: 'LEAST_LOADED',
    },
  });

  // The real node: its agent runs llama.cpp on CPU, polling often so the test is quick.
  const cpu = await gql('mutation { createNode(name: "cpu-1") { ... on CreatedNode { token } } }');
  agent = createAgent(
    loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: cpu.createNode.token,
      HANGAR_AGENT_DIR: dir,
      HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
      HANGAR_AGENT_THREADS: '1',
      HANGAR_AGENT_POLL_MS: '100',
      HANGAR_AGENT_HEARTBEAT_MS: '1000',
      HANGAR_LOG_LEVEL: 'silent',
    }),
    { log: createLogger('silent') },
  );
  await agent.start();
  await agent.heartbeat();
  await t.app.services.fleet.place();

  for (const s of standIns) {
    const mine = await t.gql('{ nodeAssignments { replicaId model } }', {}, { token: s.token });
    const a = mine.data?.nodeAssignments.find((x: { model: string }) => x.model === 'pair');
    expect(a, `no replica of pair placed on ${s.slot}`).toBeTruthy();
    pair[s.slot] = a.replicaId;
    const r = await t.gql(
      'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename } }',
      { i: { replicaId: a.replicaId, state: 'READY', endpoint: s.stand.endpoint, engineKey: s.key } },
      { token: s.token },
    );
    expect(r.data?.reportReplica.__typename).toBe('Replica');
  }

  // Everything up: tiny READY with its adapter loaded, the pair smoke-tested READY.
  const ready = await until('tiny READY with its adapter, and both stand-ins READY', async () => {
    await t.app.services.fleet.place();
    const tinys = await replicasOf('tiny');
    const pairs = await replicasOf('pair');
    const up = tinys.find((r) => r.state === 'READY' && r.adapters.includes('tiny-h200'));
    return up && pairs.filter((r) => r.state === 'READY').length === 2 ? up : undefined;
  });
  tinyReplicaId = ready.id;
  await t.app.services.gateway.routes.refresh();
}, 180_000);

afterAll(async () => {
  clearInterval(beat);
  await agent?.stop();
  await standA?.close();
  await standB?.close();
  await t?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

const ids = async (secret: string) => (await client(secret).models.list()).data.map((m) => m.id).sort();

describe('what each caller sees', () => {
  it('lists exactly the models and adapters each caller may call: a team member, an outsider, an admin', async () => {
    const everyone = ['huge', 'pair', 'tiny', 'tiny-od'];
    expect(await ids(tokens.member.secret)).toEqual([...everyone, 'tiny-h200'].sort());
    expect(await ids(tokens.outsider.secret)).toEqual([...everyone, 'outsiders-model'].sort());
    expect(await ids(admin)).toEqual([...everyone, 'outsiders-model', 'tiny-h200'].sort());

    // The adapter's card names its base and its owner as the console does.
    const card = (await client(tokens.member.secret).models.list()).data.find((m) => m.id === 'tiny-h200');
    expect(card).toMatchObject({ object: 'model', owned_by: 'team:acme/research', parent: 'tiny', root: 'tiny' });
    expect(await client(tokens.member.secret).models.retrieve('tiny-h200')).toMatchObject({ id: 'tiny-h200' });
  });

  it("answers the outsider's request for the adapter exactly as one for a name nobody has", async () => {
    const ask = async (model: string) => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${tokens.outsider.secret}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
      });
      // Every header but the date (the made-up name has the hidden one's length, so even content-length).
      const headers = [...res.headers].filter(([k]) => k !== 'date');
      return { status: res.status, headers, body: await res.text() };
    };
    const hidden = await ask('tiny-h200');
    const madeUp = await ask('tiny-h201');
    expect(hidden.status).toBe(404);
    expect(hidden).toEqual({ ...madeUp, body: madeUp.body.replaceAll('tiny-h201', 'tiny-h200') });
    expect(JSON.parse(hidden.body)).toEqual({
      error: {
        message: 'The model `tiny-h200` does not exist or you do not have access to it.',
        type: 'invalid_request_error',
        param: 'model',
        code: 'model_not_found',
      },
    });
    // The same through the client, on both routes; and the key's own model, which the member cannot see.
    const outsider = client(tokens.outsider.secret);
    for (const call of [
      () => outsider.chat.completions.create({ model: 'tiny-h200', messages: [{ role: 'user', content: 'hi' }] }),
      () => outsider.models.retrieve('tiny-h200'),
      () => client(tokens.member.secret).models.retrieve('outsiders-model'),
    ]) {
      const err = await call().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.NotFoundError);
      expect(err).toMatchObject({ status: 404, code: 'model_not_found' });
    }
  });
});

describe('chat through the gateway to llama.cpp', () => {
  it('answers a chat whole, and one streamed in pieces, with the engine’s usage', async () => {
    const member = client(tokens.member.secret);
    const whole = await member.chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'Say something.' }],
      max_tokens: 16,
      temperature: 0,
    });
    expect(whole).toMatchObject({ object: 'chat.completion', model: 'tiny' });
    expect(whole.choices[0]?.message.content?.length).toBeGreaterThan(0);
    expect(whole.usage?.completion_tokens).toBeGreaterThan(0);

    const streamed = await readChatStream(
      await member.chat.completions.create({
        model: 'tiny',
        messages: [{ role: 'user', content: 'Say something.' }],
        max_tokens: 16,
        temperature: 0,
        stream: true,
      }),
    );
    // Greedy on the same prompt: the same text, in several chunks; no usage chunk, as the client asked none.
    expect(streamed.text).toBe(whole.choices[0]?.message.content);
    expect(streamed.textChunks).toBeGreaterThan(1);
    expect(streamed.finishReason).toBe(whole.choices[0]?.finish_reason);
    expect(streamed.usage).toBeNull();
  });

  it('answers for the adapter differently from its base, each the same again', async () => {
    const member = client(tokens.member.secret);
    const complete = async (model: string) =>
      (await member.completions.create({ model, prompt: PROMPT, max_tokens: 12, temperature: 0, seed: 1 })).choices[0]
        ?.text;
    const plain = await complete('tiny');
    const tuned = await complete('tiny-h200');
    expect(plain?.length).toBeGreaterThan(0);
    expect(tuned?.length).toBeGreaterThan(0);
    expect(tuned).not.toBe(plain);
    expect(await complete('tiny')).toBe(plain);
    expect(await complete('tiny-h200')).toBe(tuned);
  });

  it('accounts the tokens the client was told of, per caller, model, adapter and replica', async () => {
    const app = client(tokens.usage.secret);
    const counted = { prompt: 0, completion: 0 };
    const add = (u: OpenAI.CompletionUsage | null | undefined) => {
      expect(u).toBeTruthy();
      counted.prompt += u?.prompt_tokens ?? 0;
      counted.completion += u?.completion_tokens ?? 0;
    };
    add(
      (
        await app.chat.completions.create({
          model: 'tiny',
          messages: [{ role: 'user', content: 'Count me.' }],
          max_tokens: 9,
        })
      ).usage,
    );
    const streamed = await readChatStream(
      await app.chat.completions.create({
        model: 'tiny',
        messages: [{ role: 'user', content: 'Count me too, streamed.' }],
        max_tokens: 7,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    add(streamed.usage);
    add((await app.completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 5 })).usage);
    const tuned = await app.completions.create({ model: 'tiny-h200', prompt: PROMPT, max_tokens: 3 });

    await t.app.services.gateway.usage.flush();
    const rows = await db().usageMinute.findMany({ where: { tokenId: tokens.usage.id } });
    const base = rows.filter((r) => r.adapter === '');
    expect(new Set(base.map((r) => [r.model, r.node, r.replicaId].join(' ')))).toEqual(
      new Set([`tiny cpu-1 ${tinyReplicaId}`]),
    );
    const sum = (rs: typeof rows, f: (r: (typeof rows)[number]) => number | bigint) =>
      rs.reduce((s, r) => s + Number(f(r)), 0);
    expect({
      requests: sum(base, (r) => r.requests),
      errors: sum(base, (r) => r.errors),
      prompt: sum(base, (r) => r.promptTokens),
      completion: sum(base, (r) => r.completionTokens),
    }).toEqual({ requests: 3, errors: 0, prompt: counted.prompt, completion: counted.completion });
    const adapterRows = rows.filter((r) => r.adapter === 'tiny-h200');
    expect({
      model: adapterRows[0]?.model,
      requests: sum(adapterRows, (r) => r.requests),
      prompt: sum(adapterRows, (r) => r.promptTokens),
      completion: sum(adapterRows, (r) => r.completionTokens),
    }).toEqual({
      model: 'tiny',
      requests: 1,
      prompt: tuned.usage?.prompt_tokens,
      completion: tuned.usage?.completion_tokens,
    });
    expect(rows.every((r) => r.userId === rows[0]?.userId && r.durationBuckets.length === 12)).toBe(true);
  });

  it('writes on flush() what was recorded while a write was already under way', async () => {
    // What a test (and the server's shutdown) relies on: flush() returns once everything recorded before it is
    // in the database, even when the timer's write had begun with fewer rows.
    const usage = t.app.services.gateway.usage;
    const event = (tokenId: string) => ({
      at: new Date(),
      tokenId,
      userId: '',
      model: 'flush-check',
      adapter: '',
      node: '',
      replicaId: '',
      outcome: 'ok' as const,
      promptTokens: 1,
      completionTokens: 1,
      ttftMs: null,
      durationMs: 1,
    });
    usage.record(event('before-the-write'));
    const underWay = usage.flush();
    usage.record(event('during-the-write'));
    await usage.flush();
    const rows = await db().usageMinute.findMany({ where: { model: 'flush-check' } });
    expect(rows.map((r) => r.tokenId).sort()).toEqual(['before-the-write', 'during-the-write']);
    await underWay;
  });

  it('aborts the replica’s work when the client goes away mid-stream: nothing stays in flight', async () => {
    const leaving = new AbortController();
    const stream = await client(tokens.member.secret).chat.completions.create(
      { model: 'tiny', messages: [{ role: 'user', content: 'Go on and on.' }], max_tokens: 400, stream: true },
      { signal: leaving.signal },
    );
    const chunks = stream[Symbol.asyncIterator]();
    await chunks.next();
    await chunks.next();
    expect(t.app.services.gateway.load(tinyReplicaId).inFlight).toBe(1);
    expect(servedModel(tinyReplicaId).active).toBe(1);
    leaving.abort();
    await until('the gateway and the agent let go of the request', async () => {
      return t.app.services.gateway.load(tinyReplicaId).inFlight === 0 && servedModel(tinyReplicaId).active === 0;
    });
    // Counted as aborted, and the replica answers the next request at once.
    await t.app.services.gateway.usage.flush();
    const rows = await db().usageMinute.findMany({ where: { tokenId: tokens.member.id, model: 'tiny' } });
    expect(rows.reduce((s, r) => s + r.aborted, 0)).toBe(1);
    const next = await client(tokens.member.secret).completions.create({
      model: 'tiny',
      prompt: PROMPT,
      max_tokens: 3,
    });
    expect(next.usage?.completion_tokens).toBe(3);
  });
});

describe('placement through requests', () => {
  it('wakes an on-demand model for a request, answers it, and stops the model its idle time after', async () => {
    expect((await replicasOf('tiny-od')).filter((r) => r.desired === 'RUN')).toEqual([]);
    const asked = client(tokens.member.secret).chat.completions.create({
      model: 'tiny-od',
      messages: [{ role: 'user', content: 'Wake up.' }],
      max_tokens: 6,
    });
    // The request waits while the model loads, and the Models page can say so.
    await until('the request waiting for tiny-od', async () => t.app.services.gateway.waiting('tiny-od') === 1);
    const answer = await asked;
    expect(answer.choices[0]?.message.content?.length).toBeGreaterThan(0);
    expect(t.app.services.gateway.waiting('tiny-od')).toBe(0);
    const woken = await db().auditEvent.findFirstOrThrow({ where: { action: 'wakeModel', target: 'tiny-od' } });
    expect(woken).toMatchObject({ outcome: 'DONE', actor: expect.stringContaining('member-app') });
    expect(woken.message).toMatch(/^woken by a request; awake until /);
    const [replica] = (await replicasOf('tiny-od')).filter((r) => r.desired === 'RUN');
    expect(replica).toMatchObject({ state: 'READY', node: { name: 'cpu-1' } });

    // The idle clock runs from the last request, not from the wake: one more request a while later moves it.
    await new Promise((r) => setTimeout(r, 1000));
    const again = await client(tokens.member.secret).completions.create({
      model: 'tiny-od',
      prompt: PROMPT,
      max_tokens: 2,
    });
    expect(again.usage?.completion_tokens).toBe(2);
    await t.app.services.gateway.usage.flush();
    const model = await db().catalogModel.findUniqueOrThrow({ where: { name: 'tiny-od' } });
    expect(model.lastRequestAt?.getTime()).toBeGreaterThanOrEqual(woken.at.getTime() + 1000);
    expect(model.awakeUntil?.getTime()).toBe((model.lastRequestAt?.getTime() ?? 0) + IDLE_SECONDS * 1000);
    expect(await db().auditEvent.count({ where: { action: 'wakeModel', target: 'tiny-od' } })).toBe(1);

    // No more requests: the placement pass stops it once that time has passed, not before.
    const stopAsked = await until(
      'tiny-od asked to stop',
      async () => {
        await t.app.services.fleet.place();
        const r = await db().replica.findUniqueOrThrow({ where: { id: replica?.id } });
        // On the clock Hangar judges idle time by (the database's, db/clock.ts), not this process's wall clock.
        return r.desired === 'STOP' ? db().clock.now() : undefined;
      },
      IDLE_SECONDS * 1000 + 30_000,
    );
    expect(stopAsked.getTime()).toBeGreaterThanOrEqual(model.awakeUntil?.getTime() ?? Number.POSITIVE_INFINITY);
    await until('the agent stopped tiny-od', async () => {
      await agent.runner.poll();
      const r = await db().replica.findUniqueOrThrow({ where: { id: replica?.id } });
      return r.state === 'STOPPED';
    });
  });

  it('keeps an on-demand model awake while a request waits for it, though loading takes longer than its idle time', async () => {
    // Played on a stand-in node: its "agent" (the test) takes three idle times to report the replica ready.
    const idle = 2;
    await db().catalogModel.create({
      data: {
        name: 'slow-od',
        source: 'http://mirror.invalid/slow-od/v1/config.json',
        engine: 'vllm',
        memoryBytes: 2n ** 30n,
        minReplicas: 0,
        maxReplicas: 1,
        idleSeconds: idle,
      },
    });
    await t.app.services.gateway.routes.refresh();
    const asked = client(tokens.member.secret).chat.completions.create({
      model: 'slow-od',
      messages: [{ role: 'user', content: 'Take your time.' }],
      stream: true,
    });
    asked.catch(() => {}); // awaited below; a failure before then must not be an unhandled rejection
    const placed = await until('slow-od placed on a stand-in node', async () => {
      const [r] = await replicasOf('slow-od');
      return r?.node ? r : undefined;
    });
    const end = Date.now() + 3 * idle * 1000;
    while (Date.now() < end) {
      await t.app.services.fleet.place();
      const r = await db().replica.findUniqueOrThrow({ where: { id: placed.id } });
      expect(r.desired, 'stopped while a request waited for it').toBe('RUN');
      await new Promise((res) => setTimeout(res, 200));
    }
    const node = standIns.find((s) => s.name === placed.node?.name);
    const reported = await t.gql(
      'mutation($i: ReplicaReportInput!) { reportReplica(input: $i) { __typename } }',
      { i: { replicaId: placed.id, state: 'READY', endpoint: node?.stand.endpoint, engineKey: node?.key } },
      { token: node?.token },
    );
    expect(reported.data?.reportReplica.__typename).toBe('Replica');
    const answer = await readChatStream(await asked);
    expect(answer.text).toBe(node?.stand.words.join(''));
  });

  it('answers 503 with the fleet’s reason and Retry-After for a model that fits on no node', async () => {
    await t.app.services.fleet.place();
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${tokens.member.secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'huge', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(503);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
    const body = (await res.json()) as { error: { message: string; type: string; code: string } };
    expect(body.error).toMatchObject({ type: 'server_error', code: 'model_unavailable' });
    expect(body.error.message).toMatch(
      /^huge cannot start: fits on no node: needs 1048576\.0 GiB, the most room is [\d.]+ GiB on \S+ GPU \d+ \(of /,
    );
    const err = await client(tokens.member.secret)
      .chat.completions.create({ model: 'huge', messages: [{ role: 'user', content: 'hi' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err).toMatchObject({ status: 503, message: expect.stringContaining('fits on no node') });
    expect((err as InstanceType<typeof OpenAI.APIError>).headers?.get('retry-after')).toBeTruthy();
  });
});

describe('two replicas of one model (stand-ins)', () => {
  const ask = (secret = tokens.member.secret) =>
    client(secret).chat.completions.create({
      model: 'pair',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });

  it('shares requests between them, each to the one with fewer in flight', async () => {
    const release = [standA.hold(), standB.hold()];
    const before = { a: standA.requests.length, b: standB.requests.length };
    const streams = [];
    try {
      for (let i = 0; i < 4; i++) {
        const s = await ask(tokens.usage.secret);
        const it = s[Symbol.asyncIterator]();
        await it.next();
        streams.push(it);
      }
      // Four held open at once: two each, whatever order they came in.
      expect([standA.requests.length - before.a, standB.requests.length - before.b]).toEqual([2, 2]);
      expect(t.app.services.gateway.load(pair.a).inFlight).toBe(2);
      expect(t.app.services.gateway.load(pair.b).inFlight).toBe(2);
    } finally {
      for (const r of release) r();
    }
    for (const it of streams) for (let n = await it.next(); !n.done; n = await it.next());
    expect(t.app.services.gateway.load(pair.a).inFlight).toBe(0);
    expect(t.app.services.gateway.load(pair.b).inFlight).toBe(0);
    await t.app.services.gateway.usage.flush();
    const rows = await db().usageMinute.findMany({ where: { tokenId: tokens.usage.id, model: 'pair' } });
    const per = (id: string) => rows.filter((r) => r.replicaId === id).reduce((s, r) => s + r.requests, 0);
    expect({ a: per(pair.a), b: per(pair.b) }).toEqual({ a: 2, b: 2 });
    expect(new Set(rows.map((r) => r.node))).toEqual(new Set(['stand-a', 'stand-b']));
  });

  it('names the replica that answered in x-hangar-replica, and sheds a conversation from an overloaded replica (PREFIX)', async () => {
    const routed = await gql(
      'mutation { setModelRouting(name: "pair", policy: PREFIX) { __typename ... on Model { routing } } }',
    );
    expect(routed.setModelRouting).toEqual({ __typename: 'Model', routing: 'PREFIX' });
    await t.app.services.gateway.routes.refresh();
    const release = [standA.hold(), standB.hold()];
    const streams = [];
    const served: string[] = [];
    try {
      // One conversation, four requests in flight at once (an agent's parallel calls with the same history).
      for (let i = 0; i < 4; i++) {
        const { data, response } = await client(tokens.usage.secret)
          .chat.completions.create({ model: 'pair', messages: [{ role: 'user', content: 'hi' }], stream: true })
          .withResponse();
        served.push(String(response.headers.get('x-hangar-replica')));
        const it = data[Symbol.asyncIterator]();
        await it.next();
        streams.push(it);
      }
    } finally {
      for (const r of release) r();
      await gql('mutation { setModelRouting(name: "pair", policy: LEAST_LOADED) { __typename } }');
      await t.app.services.gateway.routes.refresh();
    }
    for (const it of streams) for (let n = await it.next(); !n.done; n = await it.next());
    // Its replica takes it while at most HANGAR_GATEWAY_LOAD_FACTOR (1.25) times the mean; the third sheds.
    const home = served[0] as string;
    const other = home === pair.a ? pair.b : pair.a;
    expect(served).toEqual([home, home, other, home]);
  });

  it('ends the stream with an error when its replica dies mid-answer, and sends the next request to the other', async () => {
    const release = [standA.hold(), standB.hold()];
    const before = { a: standA.requests.length, b: standB.requests.length };
    const it = (await ask())[Symbol.asyncIterator]();
    await it.next();
    const [dying, other, otherId, dyingId] =
      standA.requests.length > before.a ? [standA, standB, pair.b, pair.a] : [standB, standA, pair.a, pair.b];
    expect(dying.open()).toBe(1);
    await dying.close();
    const err = await (async () => {
      for (let n = await it.next(); !n.done; n = await it.next());
    })().catch((e: unknown) => e);
    for (const r of release) r();
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as Error).message).toMatch(/The replica serving pair stopped mid-answer/);
    expect(t.app.services.gateway.load(dyingId)).toMatchObject({
      inFlight: 0,
      failing: expect.stringMatching(/^stopped mid-answer/),
    });

    const seen = other.requests.length;
    const next = await readChatStream(await ask());
    expect(next.text).toBe(other.words.join(''));
    expect(other.requests.length).toBe(seen + 1);
    expect(t.app.services.gateway.load(otherId).inFlight).toBe(0);
    // The replica's failure is the replica's: an error, not a client that left.
    await t.app.services.gateway.usage.flush();
    const rows = await db().usageMinute.findMany({ where: { tokenId: tokens.member.id, model: 'pair' } });
    const of = (id: string) => rows.filter((r) => r.replicaId === id);
    expect(of(dyingId).map((r) => [r.requests, r.errors, r.aborted])).toEqual([[1, 1, 0]]);
    expect(of(otherId).map((r) => [r.requests, r.errors, r.aborted])).toEqual([[1, 0, 0]]);
  });
});

describe('an operator stopping a model while requests flow', () => {
  it('never relays the node’s refusal of the stopped replica’s key: callers get 503 with the model’s state', async () => {
    const ask = () =>
      client(tokens.member.secret)
        .completions.create({ model: 'tiny', prompt: PROMPT, max_tokens: 1 })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
    expect(await ask()).toBeUndefined();
    // The route table's refresh is held off, so the moment between the agent's stop and the table's next read
    // (when the gateway still sends requests to the replica the node no longer serves) lasts the whole test
    // instead of about half a second.
    const routes = t.app.services.gateway.routes;
    routes.stop();
    try {
      const stopped = await gql(
        'mutation { setModelMode(name: "tiny", mode: STOPPED) { __typename ... on Error { message } } }',
      );
      expect(stopped.setModelMode.__typename).toBe('Model');
      await until('the agent stopped tiny', async () => {
        await t.app.services.fleet.place();
        await agent.runner.poll();
        const r = await db().replica.findUniqueOrThrow({ where: { id: tinyReplicaId } });
        return r.state === 'STOPPED';
      });
      const errors = await Promise.all(Array.from({ length: 4 }, ask));
      for (const err of errors) {
        expect(err).toBeInstanceOf(OpenAI.APIError);
        expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(503);
        expect((err as Error).message).toMatch(/tiny was stopped by an operator/);
      }
    } finally {
      await routes.start();
    }
  });
});
