import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { ownerKey } from '../src/org/org.service.js';
import { type ReportingNode, startReportingNode } from './fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// The second half of limits (#28, #29), through the real gateway with the official `openai` client against a
// stand-in replica (one HTTP server standing in for a llama.cpp replica of every model here): a token marked batch
// after it was made waits behind interactive requests; a limit refusal answered by the model's fallbacks the caller
// may call, never by one they may not; money spent per model on /metrics.

const KEY = 'hgk_limits-followups-engine-key-0123456789';

let t: TestApp;
let base: string;
let replica: StandInReplica;
let node: ReportingNode;
let admin: { cookie: string; csrf: string };

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  replica = await startStandInReplica({ key: KEY });
  const db = t.app.db.prisma;
  node = await startReportingNode(db, 'gpu-1');
  for (const name of ['tiny', 'spare', 'hidden']) {
    const model = await db.catalogModel.create({
      data: {
        name,
        source: `http://mirror.example/mirror/${name}/v1/model.gguf`,
        engine: 'llamacpp',
        contextSize: 2048,
      },
    });
    const r = await db.replica.create({
      data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
    });
    await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });
  }
  await t.app.services.gateway.routes.refresh();
  admin = await t.login();
}, 120_000);

afterAll(async () => {
  node?.stop();
  await replica?.close();
  await t?.close();
});

const client = (apiKey: string) => new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });

async function tokenId(name: string): Promise<string> {
  const row = await t.app.db.prisma.apiToken.findFirst({ where: { name }, select: { id: true } });
  return row?.id as string;
}

const SET_BATCH = `mutation($id: ID!, $b: Boolean!) { setTokenBatch(id: $id, batch: $b) {
  __typename ... on ApiToken { name batch } ... on Error { message } } }`;

describe('setTokenBatch', () => {
  it('marks a token batch after it was made: its requests then wait behind interactive ones', async () => {
    const person = await t.token('VIEWER', 'person');
    const job = await t.token('VIEWER', 'late-job');
    const id = await tokenId('late-job');

    // Someone else may not mark it; its owner may, and it is audited.
    const made = await t.gql(
      'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on Error { message } } }',
      { i: { email: 'other@example.com', name: 'Other', role: 'OPERATOR', password: 'another-long-password' } },
      admin,
    );
    expect(made.errors).toBeUndefined();
    const other = await t.login('other@example.com', 'another-long-password');
    const refused = await t.gql(SET_BATCH, { id, b: true }, other);
    expect(JSON.stringify(refused)).toContain('only its owner or an admin');
    const set = await t.gql(SET_BATCH, { id, b: true }, admin);
    expect(set.data?.setTokenBatch).toEqual({ __typename: 'ApiToken', name: 'late-job', batch: true });
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'setTokenBatch', target: 'late-job' },
    });
    expect(audit?.message).toContain('batch');

    const release = replica.hold();
    onTestFinished(release);
    const before = replica.requests.length;
    const stream = (secret: string) =>
      client(secret)
        .chat.completions.create({
          model: 'tiny',
          stream: true,
          max_tokens: 8,
          messages: [{ role: 'user', content: 'hi' }],
        })
        .then(async (s) => {
          let out = '';
          for await (const c of s) out += c.choices[0]?.delta?.content ?? '';
          return out;
        });
    const first = stream(person);
    await expect.poll(() => replica.requests.length).toBe(before + 1);
    const batch = stream(job);
    // Held at the gateway while an interactive request holds the only replica of tiny …
    await new Promise((r) => setTimeout(r, 500));
    expect(replica.requests.length).toBe(before + 1);
    // … and an interactive one sent after it goes first.
    const second = stream(person);
    await expect.poll(() => replica.requests.length).toBe(before + 2);
    release();
    expect(await first).toBe(replica.words.join(''));
    expect(await second).toBe(replica.words.join(''));
    expect(await batch).toBe(replica.words.join(''));
    expect(replica.requests.length).toBe(before + 3);

    // Marked interactive again, it no longer waits.
    const back = await t.gql(SET_BATCH, { id, b: false }, admin);
    expect(back.data?.setTokenBatch.batch).toBe(false);
    const release2 = replica.hold();
    onTestFinished(release2);
    const third = stream(person);
    await expect.poll(() => replica.requests.length).toBe(before + 4);
    const again = stream(job);
    await expect.poll(() => replica.requests.length).toBe(before + 5);
    release2();
    expect(await third).toBe(replica.words.join(''));
    expect(await again).toBe(replica.words.join(''));
  }, 60_000);
});

describe('a limit refusal', () => {
  const SET = `mutation($s: String!, $m: String, $l: LimitInput!) { setLimit(scope: $s, model: $m, limit: $l) {
    __typename ... on Error { message } } }`;
  const fallbacks = async (list: string[]) => {
    const r = await t.gql(
      'mutation($f: [String!]!) { setModelFallbacks(name: "tiny", fallbacks: $f) { __typename ... on Error { message } } }',
      { f: list },
      admin,
    );
    expect(r.data?.setModelFallbacks.__typename).toBe('Model');
    await t.app.services.gateway.routes.refresh();
  };
  const ask = (secret: string) =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    });

  it('is answered by the next fallback the caller may call, never by one they may not', async () => {
    // Every step below counts on one minute window (1 request per minute spent, refusals counted in it): start
    // with at least 20 s of the window left, so a window ending mid-test cannot let a refused request through.
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 20_000) await new Promise((r) => setTimeout(r, left + 250));
    const secret = await t.token('VIEWER', 'limited');
    const id = await tokenId('limited');
    // "hidden" belongs to another key: this caller may not call it, nor learn that it exists.
    await t.token('VIEWER', 'hidden-owner');
    await t.app.db.prisma.catalogModel.update({
      where: { name: 'hidden' },
      data: { owner: ownerKey({ scope: 'key', id: await tokenId('hidden-owner') }) },
    });
    await t.app.services.gateway.routes.refresh();
    const set = await t.gql(SET, { s: `key:${id}`, m: 'tiny', l: { requestsPerMinute: 1 } }, admin);
    expect(set.data?.setLimit.__typename).toBe('Limit');

    const first = await ask(secret);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-hangar-fallback')).toBeNull();
    await first.text();

    // tiny's limit is spent and its only fallback is one this caller cannot see: refused as with no fallback.
    await fallbacks(['hidden']);
    const before = replica.requests.length;
    const hidden = await ask(secret);
    expect(hidden.status).toBe(429);
    expect(hidden.headers.get('x-hangar-fallback')).toBeNull();
    const refusal = (await hidden.json()) as { error: { type: string; message: string } };
    expect(refusal.error.type).toBe('rate_limit_exceeded');
    expect(refusal.error.message).not.toContain('hidden');
    expect(replica.requests.length).toBe(before);

    // With spare listed after it, spare answers under its own limits, and the answer says so.
    await fallbacks(['hidden', 'spare']);
    const viaSpare = await client(secret)
      .chat.completions.create({
        model: 'tiny',
        stream: true,
        max_tokens: 2,
        messages: [{ role: 'user', content: 'hi' }],
      })
      .withResponse();
    expect(viaSpare.response.headers.get('x-hangar-fallback')).toBe('spare');
    const models = new Set<string>();
    for await (const chunk of viaSpare.data) models.add(chunk.model);
    expect([...models]).toEqual(['spare']);
    expect(replica.requests.at(-1)?.body.model).toBe('spare');

    // A limit on the key itself (every model) holds on the fallback too: nothing is gained by listing one.
    const all = await t.gql(SET, { s: `key:${id}`, l: { requestsPerMinute: 1 } }, admin);
    expect(all.data?.setLimit.__typename).toBe('Limit');
    const spent = await ask(secret);
    expect(spent.headers.get('x-hangar-fallback')).toBe('spare');
    await spent.text();
    const blocked = await ask(secret);
    expect(blocked.status).toBe(429);
    expect(blocked.headers.get('x-hangar-fallback')).toBeNull();
    await blocked.text();

    // Who is being refused: each limit names the callers it refused in the last minute window, and how often.
    const seen = await t.gql(
      `query($s: String!) { limits(scope: $s) { ... on QueryLimitsSuccess { data {
        model refused refusedBy { caller count kinds } } } } }`,
      { s: `key:${id}` },
      admin,
    );
    const byModel = Object.fromEntries(
      ((seen.data?.limits.data ?? []) as { model: string | null; refusedBy: unknown[] }[]).map((l) => [
        l.model ?? '*',
        l.refusedBy,
      ]),
    );
    // tiny's own limit refused this key 4 times (the hidden case, spare twice, and the last); the key's once.
    expect(byModel).toEqual({
      tiny: [{ caller: 'key:limited (admin@example.com)', count: 4, kinds: ['requestsPerMinute'] }],
      '*': [{ caller: 'key:limited (admin@example.com)', count: 1, kinds: ['requestsPerMinute'] }],
    });
  }, 60_000);
});

describe('/metrics', () => {
  it('keeps a running total of money spent per model, at its price, in the site currency', async () => {
    const price = await t.gql(
      'mutation { setModelPrice(model: "spare", perMillionPromptTokens: "1000", perMillionCompletionTokens: "2000") { __typename } }',
      {},
      admin,
    );
    expect(price.data?.setModelPrice.__typename).toBe('Price');
    await expect.poll(() => t.app.services.cost.pricing.perMillionTokens('spare')).toBeDefined();
    const secret = await t.token('VIEWER', 'spender');
    const spent = () =>
      t.app.metrics
        .render()
        .then((m) => Number(/hangar_cost_total\{model="spare",currency="USD"\} ([0-9.e-]+)/.exec(m.body)?.[1] ?? 0));
    const before = await spent();
    let prompt = 0;
    let completion = 0;
    for (let i = 0; i < 2; i++) {
      const s = await client(secret).chat.completions.create({
        model: 'spare',
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 8,
        messages: [{ role: 'user', content: 'hi' }],
      });
      for await (const c of s) {
        prompt += c.usage?.prompt_tokens ?? 0;
        completion += c.usage?.completion_tokens ?? 0;
      }
    }
    expect(completion).toBeGreaterThan(0);
    // 1000 a million prompt tokens and 2000 a million completion tokens: 0.001 and 0.002 a token.
    await expect.poll(spent).toBeCloseTo(before + prompt * 0.001 + completion * 0.002, 9);
    // An unpriced model is not counted as free money spent: it has no series.
    expect((await t.app.metrics.render()).body).not.toMatch(/hangar_cost_total\{model="tiny"/);
  }, 60_000);
});
