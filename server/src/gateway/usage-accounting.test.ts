import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DIMENSIONS,
  type LongAnswerReplica,
  PROMPT_TOKENS,
  startLongAnswerReplica,
} from '../../test/fixtures/long-answer-replica.js';
import { type ReportingNode, startReportingNode } from '../../test/fixtures/reporting-node.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// What the gateway accounts is what the caller got: the tokens of a stream the client left half-way, the usage of
// an answer too large to hold in memory, and each console user's own requests. Through the official `openai`
// client (and the console's own fetch with its session), the real gateway, and a stand-in replica on a real
// socket that gives answers the tiny test model cannot (test/fixtures/long-answer-replica.ts).

const KEY = 'hgk_usage-accounting-engine-key-0123456789ab';

let t: TestApp;
let base: string;
let replica: LongAnswerReplica;
let node: ReportingNode;
const db = () => t.app.db.prisma;

async function viewer(email: string, withToken: boolean) {
  const admin = await t.login();
  const made = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { id } ... on Error { message } } }',
    { i: { email, name: email, role: 'VIEWER', password: 'a-long-enough-password' } },
    admin,
  );
  const userId = made.data?.createUser.id as string;
  const session = await t.login(email, 'a-long-enough-password');
  if (!withToken) return { userId, session, secret: '', tokenId: '' };
  const token = await t.gql(
    'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret token { id } } } }',
    { i: { name: `${email}-app`, role: 'VIEWER' } },
    session,
  );
  const created = token.data?.createApiToken as { secret: string; token: { id: string } };
  return { userId, session, secret: created.secret, tokenId: created.token.id };
}

/** The usage rows of one caller (token, or '' and the user for a console session), once every request is in. */
async function rowsOf(where: { tokenId: string; userId?: string; model: string }, requests: number) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    await t.app.services.gateway.usage.flush();
    const rows = await db().usageMinute.findMany({ where });
    if (rows.reduce((n, r) => n + r.requests, 0) >= requests) return rows;
    if (Date.now() > deadline) throw new Error(`${requests} requests not accounted: ${JSON.stringify(rows)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const sum = (rows: { promptTokens: bigint; completionTokens: bigint }[]) => ({
  promptTokens: rows.reduce((n, r) => n + Number(r.promptTokens), 0),
  completionTokens: rows.reduce((n, r) => n + Number(r.completionTokens), 0),
});

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  replica = await startLongAnswerReplica({ key: KEY });
  node = await startReportingNode(db(), 'gpu-usage');
  const model = await db().catalogModel.create({
    data: { name: 'long', source: 'http://mirror.example/mirror/long/v1/model.gguf', engine: 'vllm' },
  });
  const r = await db().replica.create({
    data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
  });
  await db().engineKey.create({ data: { replicaId: r.id, key: KEY } });
  await t.app.services.gateway.routes.refresh();
});

afterAll(async () => {
  node?.stop();
  await replica?.close();
  await t?.close();
});

describe('usage that can be trusted', () => {
  it('accounts the tokens a client read before it left a stream, and the prompt it sent', async () => {
    const caller = await viewer('leaver@example.com', true);
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: caller.secret, maxRetries: 0 });
    const prompt =
      'Tell me the whole history of the lighthouse at the end of the harbour, in as many words as you like.';
    const stream = await client.chat.completions.create({
      model: 'long',
      messages: [{ role: 'user', content: prompt }],
      stream: true,
    });
    let read = 0;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) read++;
      if (read === 200) break; // the client leaves: 200 of the 400 tokens
    }
    expect(read).toBe(200);
    const rows = await rowsOf({ tokenId: caller.tokenId, model: 'long' }, 1);
    expect(rows.reduce((n, r) => n + r.aborted, 0)).toBe(1);
    // The engine never sent its usage (it comes after the last token): the tokens are the chunks delivered, the
    // prompt an estimate of a token per 4 characters of its text.
    expect(sum(rows)).toEqual({ promptTokens: Math.ceil(prompt.length / 4), completionTokens: 200 });
  });

  it('still takes the engine’s own usage for a stream read to its end', async () => {
    const caller = await viewer('reader@example.com', true);
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: caller.secret, maxRetries: 0 });
    replica.stream.holdAfter = null;
    try {
      const stream = await client.chat.completions.create({
        model: 'long',
        messages: [{ role: 'user', content: 'Go on.' }],
        stream: true,
      });
      let read = 0;
      for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) read++;
      expect(read).toBe(400);
    } finally {
      replica.stream.holdAfter = 200;
    }
    const rows = await rowsOf({ tokenId: caller.tokenId, model: 'long' }, 1);
    expect(sum(rows)).toEqual({ promptTokens: PROMPT_TOKENS, completionTokens: 400 });
  });

  for (const withLength of [true, false]) {
    it(`reads the usage of answers over 1 MiB (${withLength ? 'with their length' : 'chunked'}): embeddings and a long chat`, async () => {
      const caller = await viewer(`large-${withLength}@example.com`, true);
      const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: caller.secret, maxRetries: 0 });
      replica.withLength = withLength;
      const inputs = Array.from({ length: 1200 }, (_, i) => `passage ${i} of the manual`);
      const embedded = await client.embeddings.create({ model: 'long', input: inputs });
      expect(embedded.data).toHaveLength(1200);
      expect(embedded.data[0]?.embedding).toHaveLength(DIMENSIONS);
      const chat = await client.chat.completions.create({
        model: 'long',
        messages: [{ role: 'user', content: 'Write a very long answer.' }],
      });
      expect(chat.choices[0]?.message.content?.length).toBe(replica.chatChars);
      const rows = await rowsOf({ tokenId: caller.tokenId, model: 'long' }, 2);
      // What the engine said, not the numbers the chat's text quotes.
      expect(sum(rows)).toEqual({
        promptTokens: PROMPT_TOKENS * 1200 + PROMPT_TOKENS,
        completionTokens: chat.usage?.completion_tokens,
      });
      expect(chat.usage?.completion_tokens).toBe(Math.ceil(replica.chatChars / 4));
    });
  }

  it('keeps two users’ console sessions in the same minute apart, each in their own usage', async () => {
    replica.stream.holdAfter = null;
    const users = [await viewer('ann@example.com', false), await viewer('ben@example.com', false)];
    try {
      // As the console's playground calls the gateway: the session cookie and its CSRF header, no API token.
      for (const u of users) {
        const res = await fetch(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { cookie: u.session.cookie, 'x-hangar-csrf': u.session.csrf, 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'long', messages: [{ role: 'user', content: 'hi' }], stream: true }),
        });
        expect(res.status).toBe(200);
        await res.text();
      }
    } finally {
      replica.stream.holdAfter = 200;
    }
    for (const u of users) {
      const rows = await rowsOf({ tokenId: '', userId: u.userId, model: 'long' }, 1);
      expect(rows.reduce((n, r) => n + r.requests, 0)).toBe(1);
      // Each reads their own request in their usage, as the Usage page asks for it.
      const mine = await t.gql(
        'query($from: DateTime!, $to: DateTime!) { usage(model: "long", token: "", from: $from, to: $to) { ... on Usage { totals { requests completionTokens } } } }',
        { from: new Date(Date.now() - 3_600_000).toISOString(), to: new Date(Date.now() + 60_000).toISOString() },
        u.session,
      );
      expect(mine.data?.usage.totals).toEqual({ requests: 1, completionTokens: 400 });
    }
  });
});
