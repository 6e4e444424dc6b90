import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { openAiClient } from '@hangar/common/test/fixtures/openai-client';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hashSecret, newSecret } from '../src/auth/secrets.js';
import { affinityKey } from '../src/gateway/affinity.js';
import { HashRing } from '../src/gateway/ring.js';
import { ownerKey } from '../src/org/org.service.js';
import { startTestApp, type TestApp } from './harness.js';

// Routing that uses the fleet's caches (#29), as an application meets it: the official `openai` client on /v1,
// two real node agents, each running real llama.cpp (the tiny random llama, CPU) with a replica of the same model,
// placed by the real placement pass. The gateway keeps a conversation on one replica (x-hangar-replica says which,
// usage by replica shows it), spreads unrelated ones, routes each caller by its own hash, and answers from a
// model's fallback only for a caller who may call it. The replica reports the prompt tokens it did not compute
// again as OpenAI's cached_tokens. No assertion is about speed (bench/prefix-routing.ts measures that).

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const SYSTEM = 'You are a terse assistant for a team that builds hangars. Answer in one short sentence.';

let t: TestApp;
let base: string;
let admin: string;
const agents: Agent[] = [];
const dirs: string[] = [];
const db = () => t.app.db.prisma;
const callers = {} as Record<'member' | 'outsider', { secret: string; id: string; userId: string }>;
let chatReplicas: string[] = [];

async function callerToken(name: string, userId: string) {
  const secret = newSecret('api');
  const row = await db().apiToken.create({
    data: { name, prefix: secret.slice(0, 8), tokenHash: hashSecret(secret), role: 'VIEWER', callerOnly: true, userId },
  });
  return { secret, id: row.id, userId };
}

const gql = async (query: string, variables: Record<string, unknown> = {}, token = admin) => {
  const r = await t.gql(query, variables, { token });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data as Record<string, any>;
};

// Typed by the fixture: server's openai and common's are one version but two installs (their optional AWS peers).
const client = (secret: string) => openAiClient(base, secret, { timeoutMs: 90_000 });

async function until<T>(what: string, check: () => Promise<T | undefined | null | false>, ms = 120_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

type Message = { role: 'system' | 'user' | 'assistant'; content: string };

/** One chat turn through the gateway: the answer, the replica that served it and the fallback header. */
async function turn(secret: string, messages: Message[], model = 'chat') {
  const { data, response } = await client(secret)
    .chat.completions.create({ model, messages, max_tokens: 3, temperature: 0 })
    .withResponse();
  return {
    answer: data,
    replica: response.headers.get('x-hangar-replica'),
    fallback: response.headers.get('x-hangar-fallback'),
  };
}

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  admin = await t.token('ADMIN', 'routing-admin');
  const weights = tinyLlama();
  const put = await fetch(`${base}/mirror/tiny-llama/v1/model.gguf`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${admin}`, 'x-content-sha256': sha256(weights) },
    body: new Uint8Array(weights),
  });
  expect(put.status, await put.text()).toBe(201);

  // Two teams, a caller in each.
  await gql('mutation { createOrg(name: "acme") { __typename } }');
  for (const [who, team] of [
    ['member', 'research'],
    ['outsider', 'support'],
  ] as const) {
    await gql(`mutation { createTeam(org: "acme", name: "${team}") { __typename } }`);
    const user = await db().user.create({
      data: { email: `${who}@acme.test`, name: who, role: 'VIEWER', passwordHash: 'x' },
    });
    const added = await gql(
      'mutation($i: AddMemberInput!) { addMember(input: $i) { __typename ... on Error { message } } }',
      { i: { org: 'acme', team: `acme/${team}`, user: user.id } },
    );
    expect(added.addMember.__typename).toBe('Membership');
    callers[who] = await callerToken(`${who}-app`, user.id);
  }

  // "chat" on both nodes; "secret" only the outsider's key may call; "primary" stopped, falling back.
  for (const [name, mode, replicas] of [
    ['chat', 'ALWAYS', 2],
    ['secret', 'ALWAYS', 1],
    ['primary', 'STOPPED', 1],
  ] as const) {
    const served = await gql(
      `mutation { serveMirrorVersion(model: "tiny-llama", version: "v1", name: "${name}", context: 1024, mode: ${mode}, replicas: ${replicas}) { __typename ... on Error { message } } }`,
    );
    expect(served.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
  }
  await db().catalogModel.update({
    where: { name: 'secret' },
    data: { owner: ownerKey({ scope: 'key', id: callers.outsider.id }) },
  });

  // Two real nodes: each agent runs llama.cpp on the CPU.
  for (const name of ['cpu-a', 'cpu-b']) {
    const node = await gql(`mutation { createNode(name: "${name}") { ... on CreatedNode { token } } }`);
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), `hangar-routing-${name}-`));
    dirs.push(dir);
    const agent = createAgent(
      loadAgentConfig({
        HANGAR_URL: base,
        HANGAR_NODE_TOKEN: node.createNode.token,
        HANGAR_AGENT_DIR: dir,
        HANGAR_AGENT_GPUS: '[{"name":"RTX 4090","totalMiB":24564,"freeMiB":20000}]',
        HANGAR_AGENT_THREADS: '1',
        HANGAR_AGENT_POLL_MS: '100',
        HANGAR_AGENT_HEARTBEAT_MS: '1000',
        HANGAR_LOG_LEVEL: 'silent',
      }),
      { log: createLogger('silent') },
    );
    agents.push(agent);
    await agent.start();
    await agent.heartbeat();
  }
  await until('two READY replicas of chat, one of secret', async () => {
    await t.app.services.fleet.place();
    const rows = await db().replica.findMany({ where: { state: 'READY' }, include: { model: true, node: true } });
    const chat = rows.filter((r) => r.model.name === 'chat');
    if (chat.length !== 2 || new Set(chat.map((r) => r.node?.name)).size !== 2) return undefined;
    if (!rows.some((r) => r.model.name === 'secret')) return undefined;
    chatReplicas = chat.map((r) => r.id).sort();
    return true;
  });
  await t.app.services.gateway.routes.refresh();
}, 240_000);

afterAll(async () => {
  for (const a of agents) await a.stop();
  await t?.close();
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

describe('prefix routing over two real llama.cpp replicas', () => {
  it('keeps 20 turns of one conversation on one replica, which reuses its earlier turns (cached_tokens)', async () => {
    const from = new Date(Date.now() - 60_000).toISOString();
    const messages: Message[] = [
      { role: 'system', content: SYSTEM },
      { role: 'user', content: 'Where do we keep the spare propellers?' },
    ];
    const served: string[] = [];
    for (let n = 1; n <= 20; n++) {
      const { answer, replica } = await turn(callers.member.secret, messages);
      served.push(String(replica));
      const usage = answer.usage;
      if (n >= 2) {
        // The sequence the previous turn left holds everything up to it: only the new turn is computed.
        expect(usage?.prompt_tokens_details?.cached_tokens, `turn ${n}`).toBeGreaterThan(0);
        expect(usage?.prompt_tokens_details?.cached_tokens).toBeLessThan(usage?.prompt_tokens ?? 0);
      }
      messages.push({ role: 'assistant', content: answer.choices[0]?.message.content ?? '' });
      messages.push({ role: 'user', content: `Turn ${n + 1}: and after that?` });
    }
    expect(new Set(served).size).toBe(1);
    const [held] = served as [string];
    expect(chatReplicas).toContain(held);

    // Usage grouped by replica says the same, for scripts that follow where conversations went.
    await t.app.services.gateway.usage.flush();
    const to = new Date(Date.now() + 60_000).toISOString();
    const byReplica = async (replica: string) =>
      (
        await gql(
          'query($r: ID!, $k: ID!, $from: DateTime!, $to: DateTime!) { usage(model: "chat", replica: $r, token: $k, from: $from, to: $to, step: 5) { ... on Usage { totals { requests } } } }',
          { r: replica, k: callers.member.id, from, to },
        )
      ).usage.totals.requests;
    const other = chatReplicas.find((r) => r !== held) as string;
    expect({ held: await byReplica(held), other: await byReplica(other) }).toEqual({ held: 20, other: 0 });
  }, 180_000);

  it('spreads 20 unrelated conversations over both replicas', async () => {
    const seen = new Map<string, number>();
    for (let c = 0; c < 20; c++) {
      const { replica } = await turn(callers.member.secret, [
        { role: 'system', content: SYSTEM },
        { role: 'user', content: `Conversation ${c}: what is hangar door number ${c * 7} made of?` },
      ]);
      seen.set(String(replica), (seen.get(String(replica)) ?? 0) + 1);
    }
    expect([...seen.keys()].sort()).toEqual(chatReplicas);
  }, 120_000);

  it("routes two teams' callers sending the same prompt each by their own hash", async () => {
    // The ring every server builds from the replica set (ring.ts), asked here independently of the gateway.
    const model = t.app.services.gateway.routes.lookup('chat')?.model;
    if (!model) throw new Error('chat is not in the route table');
    const ring = new HashRing(model.replicas.map((r) => r.id));
    const expected = (userId: string, body: Record<string, unknown>) =>
      model.replicas[
        ring.pick(
          affinityKey({
            policy: 'PREFIX',
            route: '/chat/completions',
            body,
            headers: {},
            scope: userId,
            adapter: '',
          }) ?? 0,
          1,
          () => true,
          () => 0,
        )
      ]?.id;
    // A prompt whose two hashes (member's scope, outsider's) name different replicas: each caller's own.
    let body: { messages: Message[] } | undefined;
    for (let i = 0; i < 200 && !body; i++) {
      const candidate = {
        messages: [
          { role: 'system' as const, content: SYSTEM },
          { role: 'user' as const, content: `Shared question ${i}: who signs the hangar log?` },
        ],
      };
      if (expected(callers.member.userId, candidate) !== expected(callers.outsider.userId, candidate)) body = candidate;
    }
    if (!body) throw new Error('no prompt in 200 whose two callers hash apart: the scope is not in the hash');
    const m = await turn(callers.member.secret, body.messages);
    const o = await turn(callers.outsider.secret, body.messages);
    expect(m.replica).toBe(expected(callers.member.userId, body));
    expect(o.replica).toBe(expected(callers.outsider.userId, body));
    expect(m.replica).not.toBe(o.replica);
  }, 60_000);
});

describe('fallbacks', () => {
  const ask = (secret: string) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'primary', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    });

  it('answers from the next model the caller may call when the first is stopped, and says which', async () => {
    const set = await gql(
      'mutation { setModelFallbacks(name: "primary", fallbacks: ["secret", "chat"]) { __typename ... on Model { fallbacks } ... on Error { message } } }',
    );
    expect(set.setModelFallbacks).toEqual({ __typename: 'Model', fallbacks: ['secret', 'chat'] });
    await t.app.services.gateway.routes.refresh();

    // The member may not call "secret": it is passed over as if not listed, and "chat" answers.
    const member = await ask(callers.member.secret);
    expect(member.status).toBe(200);
    expect(member.headers.get('x-hangar-fallback')).toBe('chat');
    expect(chatReplicas).toContain(member.headers.get('x-hangar-replica'));
    expect(((await member.json()) as { model: string }).model).toBe('chat');

    // The outsider may: "secret" answers them, first in the list.
    const outsider = await ask(callers.outsider.secret);
    expect(outsider.status).toBe(200);
    expect(outsider.headers.get('x-hangar-fallback')).toBe('secret');
    expect(((await outsider.json()) as { model: string }).model).toBe('secret');
  }, 60_000);

  it('never falls back to a model the caller cannot see: the answer is the stopped model’s own', async () => {
    await gql('mutation { setModelFallbacks(name: "primary", fallbacks: []) { __typename } }');
    await t.app.services.gateway.routes.refresh();
    const plain = await ask(callers.member.secret);
    const plainBody = await plain.text();

    await gql('mutation { setModelFallbacks(name: "primary", fallbacks: ["secret"]) { __typename } }');
    await t.app.services.gateway.routes.refresh();
    const hidden = await ask(callers.member.secret);
    // Exactly as with no fallback: nothing tells the member that "secret" exists.
    expect(hidden.status).toBe(503);
    expect(hidden.headers.get('x-hangar-fallback')).toBeNull();
    expect(await hidden.text()).toBe(plainBody);
    expect(plain.status).toBe(503);
  }, 60_000);

  it('refuses a fallback list naming the model itself, or a model the operator cannot see', async () => {
    const self = await gql(
      'mutation { setModelFallbacks(name: "primary", fallbacks: ["primary"]) { __typename ... on ValidationError { field message } } }',
    );
    expect(self.setModelFallbacks).toMatchObject({ __typename: 'ValidationError', field: 'fallbacks.0' });
    const none = await gql(
      'mutation { setModelFallbacks(name: "primary", fallbacks: ["chat", "nowhere"]) { __typename ... on ValidationError { field message } } }',
    );
    expect(none.setModelFallbacks).toMatchObject({ __typename: 'ValidationError', field: 'fallbacks.1' });
    expect(none.setModelFallbacks.message).toMatch(/the catalog has no model nowhere/);
  });
});
