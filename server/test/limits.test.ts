import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type ReportingNode, startReportingNode } from './fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// Limits through the real gateway, with the official `openai` client against a stand-in replica: a key's
// requests per minute refused on the 6th with OpenAI's 429, headers and Retry-After, and the client's own retry
// getting through after the reset; a client that leaves mid-stream charged what reached it; a batch token's
// request waiting behind interactive ones; setLimit's refusals naming the field. The "minute" is 4 s here
// (HANGAR_LIMIT_MINUTE_SECONDS), so the reset comes within the test.

const KEY = 'hgk_limits-test-engine-key-0123456789abcdef';
const MINUTE_MS = 4000;

let t: TestApp;
let base: string;
let replica: StandInReplica;
let node: ReportingNode;
let admin: { cookie: string; csrf: string };

beforeAll(async () => {
  t = await startTestApp({ HANGAR_LIMIT_MINUTE_SECONDS: String(MINUTE_MS / 1000) });
  base = await t.app.start();
  replica = await startStandInReplica({ key: KEY });
  const db = t.app.db.prisma;
  node = await startReportingNode(db, 'gpu-1');
  const model = await db.catalogModel.create({
    data: {
      name: 'tiny',
      source: 'http://mirror.example/mirror/tiny/v1/model.gguf',
      engine: 'llamacpp',
      contextSize: 2048,
    },
  });
  const r = await db.replica.create({
    data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
  });
  await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });
  await t.app.services.gateway.routes.refresh();
  admin = await t.login();
}, 120_000);

afterAll(async () => {
  node?.stop();
  await replica?.close();
  await t?.close();
});

const SET = `mutation($s: String!, $m: String, $l: LimitInput!) { setLimit(scope: $s, model: $m, limit: $l) {
  __typename ... on Limit { id scope model requestsPerMinute refused usage { kind limit used remaining } }
  ... on ValidationError { field message } ... on Error { message } } }`;

async function tokenId(name: string): Promise<string> {
  const row = await t.app.db.prisma.apiToken.findFirst({ where: { name }, select: { id: true } });
  return row?.id as string;
}

/** Waits until a fresh window of the test's minute has just begun, so a burst fits in one. */
async function startOfWindow() {
  const now = () => t.app.db.prisma.clock.nowMs();
  const into = now() % MINUTE_MS;
  if (into > 300) await new Promise((r) => setTimeout(r, MINUTE_MS - into + 50));
}

const client = (apiKey: string, maxRetries = 0) => new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries });

describe('a key limited to 5 requests per minute', () => {
  it('answers 429 on the 6th with OpenAI’s headers and Retry-After, and the client’s retry succeeds after the reset', async () => {
    const secret = await t.token('VIEWER', 'rpm-app');
    const id = await tokenId('rpm-app');
    const set = await t.gql(SET, { s: `key:${id}`, l: { requestsPerMinute: 5 } }, admin);
    expect(set.data?.setLimit).toMatchObject({ __typename: 'Limit', requestsPerMinute: 5 });

    await startOfWindow();
    const remaining: string[] = [];
    for (let i = 0; i < 5; i++) {
      const { data, response } = await client(secret)
        .chat.completions.create({
          model: 'tiny',
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 8,
          stream: true,
        })
        .withResponse();
      expect(await text(data)).toBe(replica.words.join(''));
      expect(response.headers.get('x-ratelimit-limit-requests')).toBe('5');
      expect(response.headers.get('x-ratelimit-reset-requests')).toMatch(/^\d+(ms|s)$/);
      remaining.push(response.headers.get('x-ratelimit-remaining-requests') as string);
    }
    expect(remaining).toEqual(['4', '3', '2', '1', '0']);

    const sent = replica.requests.length;
    const err = await client(secret)
      .chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    const e = err as InstanceType<typeof OpenAI.RateLimitError>;
    expect(e.status).toBe(429);
    expect(e.error).toMatchObject({ type: 'rate_limit_exceeded', code: 'rate_limit_exceeded' });
    expect(e.message).toContain('requests per minute');
    expect(e.message).toContain('key:rpm-app');
    expect(Number(e.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(Number(e.headers?.get('retry-after'))).toBeLessThanOrEqual(MINUTE_MS / 1000);
    expect(e.headers?.get('x-ratelimit-limit-requests')).toBe('5');
    expect(e.headers?.get('x-ratelimit-remaining-requests')).toBe('0');
    // Refused at the gateway: the replica never saw it.
    expect(replica.requests.length).toBe(sent);

    // The client's own retry logic reads Retry-After and gets through once the window resets.
    const refusedBefore = await refusedCount(`key:${id}`);
    const retried = await client(secret, 3).chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 8,
      stream: true,
    });
    expect(await text(retried)).toBe(replica.words.join(''));
    // It was refused at least once first (still in the same window), then let through.
    expect(await refusedCount(`key:${id}`)).toBeGreaterThan(refusedBefore);
    // /metrics: refusals and what is left, by scope and kind.
    const metrics = (await t.app.metrics.render()).body;
    expect(metrics).toMatch(/hangar_limit_refusals\{scope="key:rpm-app[^"]*",kind="requestsPerMinute"\} [1-9]/);
    expect(metrics).toMatch(
      /hangar_limit_remaining\{scope="key:rpm-app[^"]*",model="\*",kind="requestsPerMinute"\} \d/,
    );
    // The audit log counts refusals per limit and minute: a row with a count, not a row per request.
    await expect
      .poll(
        async () =>
          (await t.app.db.prisma.auditEvent.findMany({ where: { action: 'limitRefused', outcome: 'REFUSED' } })).reduce(
            (sum, r) => sum + r.repeats,
            0,
          ),
        { timeout: 15_000 },
      )
      .toBeGreaterThanOrEqual(2);
    const rows = await t.app.db.prisma.auditEvent.findMany({ where: { action: 'limitRefused' } });
    expect(rows.length).toBeLessThanOrEqual(2);
    expect(rows[0]?.message).toMatch(/requests refused by requestsPerMinute in the minute from/);
  }, 60_000);
});

async function text(stream: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>): Promise<string> {
  let out = '';
  for await (const c of stream) out += c.choices[0]?.delta?.content ?? '';
  return out;
}

async function limitsOf(scope: string, fields: string): Promise<Record<string, any>[]> {
  const r = await t.gql(
    `query($s: String) { limits(scope: $s) { ... on QueryLimitsSuccess { data { ${fields} } } } }`,
    { s: scope },
    admin,
  );
  return r.data?.limits.data;
}

async function refusedCount(scope: string): Promise<number> {
  return (await limitsOf(scope, 'refused')).reduce((a, l) => a + l.refused, 0);
}

describe('a client that leaves mid-stream', () => {
  it('is charged what it received, not what it reserved', async () => {
    const secret = await t.token('VIEWER', 'leaver');
    const id = await tokenId('leaver');
    const set = await t.gql(SET, { s: `key:${id}`, l: { tokensPerDay: 100_000 } }, admin);
    expect(set.data?.setLimit.__typename).toBe('Limit');
    const release = replica.hold();
    onTestFinished(release);
    const abort = new AbortController();
    const content = 'tell me a long story'; // 20 characters: the gateway estimates 5 prompt tokens
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', stream: true, max_tokens: 500, messages: [{ role: 'user', content }] }),
      signal: abort.signal,
    });
    expect(res.headers.get('x-ratelimit-limit-tokens')).toBe('100000');
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    let text = '';
    while (!text.includes('Hello')) text += new TextDecoder().decode((await reader.read()).value);
    // While it streams, its worst case is held: the prompt's bound plus max_tokens.
    const during = await usedOf(`key:${id}`, 'tokensPerDay');
    expect(during).toBeGreaterThanOrEqual(500);
    abort.abort();
    // The gateway ends the replica's answer when its client goes; only then may the replica go on (to nobody).
    await expect.poll(() => replica.open()).toBe(0);
    release();
    // One word reached it (" Hello"), and the prompt the engine read: 5 estimated tokens + 1.
    await expect.poll(() => usedOf(`key:${id}`, 'tokensPerDay'), { timeout: 10_000 }).toBe(6);
    // And settled so in PostgreSQL, where every process reads it, once the slice is idle.
    const limitId = set.data?.setLimit.id as string;
    await expect
      .poll(
        async () => {
          const row = await t.app.db.prisma.limitWindow.findFirst({ where: { limitId, kind: 'tokensPerDay' } });
          return row ? Number(row.used) : -1;
        },
        { timeout: 10_000 },
      )
      .toBe(6);
  }, 30_000);
});

async function usedOf(scope: string, kind: string): Promise<number> {
  const all = (await limitsOf(scope, 'usage { kind used }')).flatMap(
    (l) => l.usage as { kind: string; used: number }[],
  );
  return all.find((u) => u.kind === kind)?.used ?? -1;
}

describe('a batch token', () => {
  it('waits behind interactive requests for the replica, and goes once they end', async () => {
    const interactive = await t.token('VIEWER', 'person');
    const batchSecret = await batchToken('nightly');
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
    const first = stream(interactive);
    await expect.poll(() => replica.requests.length).toBe(before + 1);
    const batch = stream(batchSecret);
    // The batch request is held at the gateway while an interactive one holds the only replica …
    await new Promise((r) => setTimeout(r, 500));
    expect(replica.requests.length).toBe(before + 1);
    // … and an interactive one that comes after it is sent at once, ahead of it.
    const second = stream(interactive);
    await expect.poll(() => replica.requests.length).toBe(before + 2);
    expect(replica.requests.length).toBe(before + 2);
    release();
    expect(await first).toBe(replica.words.join(''));
    expect(await second).toBe(replica.words.join(''));
    expect(await batch).toBe(replica.words.join(''));
    expect(replica.requests.length).toBe(before + 3);
  }, 30_000);

  it('is refused first when a budget runs low: it may not take its last tenth', async () => {
    const person = await t.token('VIEWER', 'person-2');
    const nightly = await batchToken('nightly-2');
    const user = await t.app.db.prisma.apiToken.findFirst({ where: { name: 'nightly-2' }, select: { userId: true } });
    const email = (await t.app.db.prisma.user.findUnique({ where: { id: user?.userId as string } }))?.email;
    // Both tokens are the admin's: one user's budget of 10 requests a minute, shared.
    const set = await t.gql(SET, { s: `user:${email}`, l: { requestsPerMinute: 10 } }, admin);
    expect(set.data?.setLimit.__typename).toBe('Limit');
    await startOfWindow();
    const ask = (secret: string) =>
      client(secret)
        .chat.completions.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] })
        .then(
          () => 'ok',
          (e: { status?: number }) => String(e.status),
        );
    const batchAnswers: string[] = [];
    for (let i = 0; i < 9; i++) batchAnswers.push(await ask(nightly));
    // Nine of ten is the most a batch token may take; the tenth request is kept for a person.
    expect(batchAnswers).toEqual(['ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok']);
    expect(await ask(nightly)).toBe('429');
    expect(await ask(person)).toBe('ok');
    expect(await ask(person)).toBe('429');
    await t.gql('mutation($s: String!) { removeLimit(scope: $s) { __typename } }', { s: `user:${email}` }, admin);
  }, 30_000);
});

async function batchToken(name: string): Promise<string> {
  const r = await t.gql(
    'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on CreatedApiToken { secret token { batch } } } }',
    { i: { name, role: 'VIEWER', batch: true } },
    admin,
  );
  expect(r.data?.createApiToken.token.batch).toBe(true);
  return r.data?.createApiToken.secret as string;
}

describe('a spend budget per month', () => {
  it('prices each request at the model’s price and refuses, as insufficient_quota, what would pass the budget', async () => {
    const price = await t.gql(
      'mutation { setModelPrice(model: "tiny", perMillionPromptTokens: "1000", perMillionCompletionTokens: "1000") { __typename } }',
      {},
      admin,
    );
    expect(price.data?.setModelPrice.__typename).toBe('Price');
    await expect.poll(() => t.app.services.cost.pricing.perMillionTokens('tiny')).toBeDefined();
    const secret = await t.token('VIEWER', 'spender');
    const id = await tokenId('spender');
    // 1000 a million tokens is 0.001 a token: a request reserving 45 tokens (the prompt's bound and max_tokens 3)
    // holds 0.045 and spends 0.007 (the 7 tokens the replica answers); a second one would pass 0.05.
    const set = await t.gql(SET, { s: `key:${id}`, l: { spendPerMonth: 0.05 } }, admin);
    expect(set.data?.setLimit.__typename).toBe('Limit');
    const ask = () =>
      client(secret).chat.completions.create({
        model: 'tiny',
        stream: true,
        max_tokens: 3,
        messages: [{ role: 'user', content: 'hi' }],
      });
    expect(await text(await ask())).toBe(replica.words.join(''));
    const err = await ask().then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err?.status).toBe(429);
    expect(err?.error).toMatchObject({ type: 'insufficient_quota', code: 'insufficient_quota' });
    expect(err?.message).toContain('spend per month');
    expect(err?.headers?.get('x-should-retry')).toBe('false');
    expect(await usedOf(`key:${id}`, 'spendPerMonth')).toBeCloseTo(0.007, 6);
  });
});

describe('setLimit, removeLimit and limits', () => {
  it('refuses a bad scope, model or value naming the field, and a non-admin', async () => {
    const bad = async (v: Record<string, unknown>) => (await t.gql(SET, v, admin)).data?.setLimit;
    expect(await bad({ s: 'team:nobody/none', l: { requestsPerMinute: 1 } })).toMatchObject({
      __typename: 'ValidationError',
      field: 'scope',
    });
    expect(await bad({ s: 'org:', l: { requestsPerMinute: 1 } })).toMatchObject({ __typename: 'ValidationError' });
    expect(await bad({ s: `user:admin@example.com`, m: 'no-such-model', l: { requestsPerMinute: 1 } })).toMatchObject({
      __typename: 'ValidationError',
      field: 'model',
    });
    expect(await bad({ s: `user:admin@example.com`, l: { tokensPerMinute: -1 } })).toMatchObject({
      __typename: 'ValidationError',
      field: 'limit.tokensPerMinute',
    });
    expect(await bad({ s: `user:admin@example.com`, l: { spendPerMonth: 1.234 } })).toMatchObject({
      __typename: 'ValidationError',
      field: 'limit.spendPerMonth',
    });
    expect(await bad({ s: `user:admin@example.com`, l: {} })).toMatchObject({
      __typename: 'ValidationError',
      field: 'limit',
    });
    const viewer = await t.token('VIEWER', 'not-an-admin');
    const r = await t.gql(SET, { s: 'user:admin@example.com', l: { requestsPerMinute: 1 } }, { token: viewer });
    expect(r.data?.setLimit ?? r.errors).toBeTruthy();
    expect(r.data?.setLimit?.__typename ?? 'refused').not.toBe('Limit');
    // Refusals and changes are audited.
    const audit = await t.app.db.prisma.auditEvent.findMany({ where: { action: 'setLimit' } });
    expect(audit.some((a) => a.outcome === 'REFUSED')).toBe(true);
    expect(audit.some((a) => a.outcome === 'DONE')).toBe(true);
  });

  it('sets a model’s limit, lists it for the scope and removes it', async () => {
    const set = await t.gql(SET, { s: 'user:admin@example.com', m: 'tiny', l: { concurrentRequests: 3 } }, admin);
    expect(set.data?.setLimit).toMatchObject({ __typename: 'Limit', model: 'tiny', scope: 'user:admin@example.com' });
    expect(await limitsOf('user:admin@example.com', 'model concurrentRequests')).toContainEqual({
      model: 'tiny',
      concurrentRequests: 3,
    });
    const removed = await t.gql(
      'mutation { removeLimit(scope: "user:admin@example.com", model: "tiny") { __typename ... on Limit { model } } }',
      {},
      admin,
    );
    expect(removed.data?.removeLimit).toMatchObject({ __typename: 'Limit', model: 'tiny' });
    const again = await t.gql(
      'mutation { removeLimit(scope: "user:admin@example.com", model: "tiny") { __typename } }',
      {},
      admin,
    );
    expect(again.data?.removeLimit.__typename).toBe('NotFoundError');
  });
});
