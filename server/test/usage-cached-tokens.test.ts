import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type ReportingNode, startReportingNode } from './fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// #29: the prompt tokens a replica reused from its prompt cache (OpenAI's usage.prompt_tokens_details.cached_tokens)
// are counted in usage, through the real gateway with the official `openai` client. The stand-in replica stands
// for a llama.cpp replica with a warm cache: it says it reused 3 of its 4 prompt tokens (the real agent's
// reporting is tested in packages/agent's endpoint.test.ts and server/test/prefix-routing.test.ts).

const KEY = 'hgk_usage-cached-engine-key-0123456789abcd';

let t: TestApp;
let base: string;
let replica: StandInReplica;
let node: ReportingNode;

beforeAll(async () => {
  t = await startTestApp();
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
}, 120_000);

afterAll(async () => {
  node?.stop();
  await replica?.close();
  await t?.close();
});

it('sums the cached tokens each answer reports into usage totals and points, as cachedTokens', async () => {
  const from = new Date(Date.now() - 60_000);
  const secret = await t.token('VIEWER', 'cached');
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: secret, maxRetries: 0 });
  const ask = async () => {
    const s = await client.chat.completions.create({
      model: 'tiny',
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'hi' }],
    });
    let cached: number | undefined;
    for await (const c of s) cached ??= c.usage?.prompt_tokens_details?.cached_tokens;
    return cached;
  };
  // A cold cache says nothing; a warm one says 3 of the prompt's 4 tokens were reused.
  expect(await ask()).toBeUndefined();
  replica.cachedTokens = 3;
  expect(await ask()).toBe(3);
  expect(await ask()).toBe(3);
  await t.app.services.gateway.usage.flush();

  const admin = await t.login();
  const r = await t.gql(
    `query($from: DateTime!, $to: DateTime!) { usage(model: "tiny", from: $from, to: $to, step: 5) {
      ... on Usage { totals { requests promptTokens cachedTokens } points { cachedTokens } } ... on Error { message } } }`,
    { from: from.toISOString(), to: new Date(Date.now() + 60_000).toISOString() },
    admin,
  );
  expect(r.data?.usage.totals).toEqual({ requests: 3, promptTokens: 12, cachedTokens: 6 });
  const points = r.data?.usage.points as { cachedTokens: number }[];
  expect(points.reduce((n, p) => n + p.cachedTokens, 0)).toBe(6);
}, 60_000);
