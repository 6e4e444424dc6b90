import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ReportingNode, startReportingNode } from './fixtures/reporting-node.js';
import { type ServerProcess, startServer } from './fixtures/server-process.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// One team's token budget held by two server processes on one PostgreSQL: this test's own server, and a second
// one started as an operator starts it (`node src/main.ts`, its own process and memory), both taking streamed
// requests at once through the official client. Each process leases slices of the budget from PostgreSQL; what
// they let through together never passes the budget. The worst-case overshoot docs/architecture.md gives is
// the sum, over requests in flight, of what each used beyond its reservation; the stand-in replica answers 7
// tokens (4 prompt, 3 completion) to requests that reserve at least 45, so here it is 0.

const KEY = 'hgk_limits-processes-engine-key-0123456789abcdef';
const BUDGET = 300;
const PER_ANSWER = 7;

let t: TestApp;
let a: string;
let b: ServerProcess;
let replica: StandInReplica;
let node: ReportingNode;
let secret: string;
let adminSession: { cookie: string; csrf: string };
/** The type of the last 429's error: insufficient_quota for a budget, rate_limit_exceeded for a rate. */
let lastRefusal: string | undefined;

beforeAll(async () => {
  t = await startTestApp();
  a = await t.app.start();
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
  const admin = await t.login();
  adminSession = admin;
  secret = await t.token('VIEWER', 'research-app');
  const id = (await db.apiToken.findFirst({ where: { name: 'research-app' } }))?.id as string;
  const ok = async (query: string, variables: Record<string, unknown>) => {
    const res = await t.gql(query, variables, admin);
    expect(JSON.stringify(res.data)).not.toContain('Error');
    return res.data;
  };
  await ok('mutation { createOrg(name: "acme") { __typename } }', {});
  await ok('mutation { createTeam(org: "acme", name: "research") { __typename } }', {});
  await ok('mutation($i: AddMemberInput!) { addMember(input: $i) { __typename } }', {
    i: { org: 'acme', team: 'research', apiToken: id },
  });
  await ok('mutation($l: LimitInput!) { setLimit(scope: "team:acme/research", limit: $l) { __typename } }', {
    l: { tokensPerDay: BUDGET },
  });
  // The second process: same database, same data dir (the shared mirror storage), its own memory.
  b = await startServer({ DATABASE_URL: t.app.db.url, HANGAR_DATA_DIR: t.dataDir, HANGAR_LOG_LEVEL: 'error' }, 120_000);
}, 180_000);

afterAll(async () => {
  if (b) {
    b.proc.kill('SIGTERM');
    await b.exited;
  }
  node?.stop();
  await replica?.close();
  await t?.close();
});

async function streamed(base: string): Promise<'ok' | number> {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: secret, maxRetries: 0 });
  try {
    const s = await client.chat.completions.create({
      model: 'tiny',
      stream: true,
      max_tokens: 3,
      messages: [{ role: 'user', content: 'hi' }],
    });
    let text = '';
    for await (const c of s) text += c.choices[0]?.delta?.content ?? '';
    expect(text).toBe(replica.words.join(''));
    return 'ok';
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status === 429) {
      lastRefusal = (err.error as { type?: string }).type;
      return 429;
    }
    throw err;
  }
}

describe('a team’s token budget over two server processes', () => {
  it('lets through no more than the budget with 20 concurrent streams at a time, and counts exactly', async () => {
    const served = { a: 0, b: 0 };
    let refused = 0;
    // Rounds of 20 at once, half to each process, until the budget refuses every request of a round.
    for (let round = 0; round < 8; round++) {
      const answers = await Promise.all(
        Array.from({ length: 20 }, (_, i) => streamed(i % 2 ? b.base : a).then((r) => ({ r, at: i % 2 ? 'b' : 'a' }))),
      );
      for (const { r, at } of answers) {
        if (r === 'ok') served[at as 'a' | 'b']++;
        else refused++;
      }
      if (answers.every(({ r }) => r !== 'ok')) break;
    }
    const tokens = (served.a + served.b) * PER_ANSWER;
    // Never past the budget (the documented worst case here is 0 tokens over) …
    expect(tokens).toBeLessThanOrEqual(BUDGET);
    // … and not far under it: at most one answer's worth plus the reservations of the last round left unused.
    expect(tokens).toBeGreaterThan(BUDGET / 2);
    expect(served.a).toBeGreaterThan(0);
    expect(served.b).toBeGreaterThan(0);
    expect(refused).toBeGreaterThan(0);
    // Both processes settle to PostgreSQL what they delivered, exactly.
    await expect
      .poll(
        async () => {
          const rows = await t.app.db.prisma.limitWindow.findMany({ where: { kind: 'tokensPerDay' } });
          return rows.reduce((sum, r) => sum + Number(r.used), 0);
        },
        { timeout: 15_000 },
      )
      .toBe(tokens);
  }, 120_000);

  it('applies a limit changed in one process on the other’s next requests', async () => {
    // Set through this process (replacing the team's budget): the other hears it (PostgreSQL's NOTIFY) and refuses.
    const set = await t.gql(
      'mutation { setLimit(scope: "team:acme/research", limit: { requestsPerMinute: 0 }) { __typename } }',
      {},
      adminSession,
    );
    expect(set.data?.setLimit.__typename).toBe('Limit');
    await expect.poll(() => streamed(b.base), { timeout: 5000 }).toBe(429);
    expect(lastRefusal).toBe('rate_limit_exceeded');
    // Removed here: the other lets the team through again.
    const removed = await t.gql(
      'mutation { removeLimit(scope: "team:acme/research") { __typename } }',
      {},
      adminSession,
    );
    expect(removed.data?.removeLimit.__typename).toBe('Limit');
    await expect.poll(() => streamed(b.base), { timeout: 5000 }).toBe('ok');
  }, 60_000);
});
