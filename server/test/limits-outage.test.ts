import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPrisma } from '../src/db/client.js';
import { createDatabaseIfMissing } from '../src/db/embedded.js';
import { migrate } from '../src/db/migrate.js';
import { type Cluster, killCluster, makeCluster, startCluster } from './fixtures/pg-cluster.js';
import { startReportingNode } from './fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from './fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from './harness.js';

// PostgreSQL killed (`pg_ctl stop -m immediate`, on a cluster of this file's own) while an application sends
// requests under a token budget: the gateway goes on answering from the slice of the budget this process already
// held, and once that is spent it refuses, saying the database is away; nothing becomes unlimited. The budget is
// far larger than a slice, so without the slices' rule every request after the kill would be answered.

const KEY = 'hgk_limits-outage-engine-key-0123456789abcdef';
const BUDGET = 10_000;
/** A slice is a tenth of a limit (limits-enforcer.ts), plus the reservation that asked for it. */
const MOST_HELD = BUDGET / 10 + 100;
const PER_ANSWER = 7;

let root: string;
let cluster: Cluster;
let stopNode: (() => void) | undefined;
let down = false;
let t: TestApp;
let base: string;
let replica: StandInReplica;
let secret: string;

beforeAll(async () => {
  root = path.join(os.tmpdir(), `hangar-limits-outage-${process.pid}-${randomBytes(3).toString('hex')}`);
  await fs.mkdir(root, { recursive: true, mode: 0o755 });
  cluster = await makeCluster(root);
  await startCluster(cluster);
  await createDatabaseIfMissing(cluster.url('postgres'), 'hangar');
  const url = cluster.url('hangar');
  await migrate(url, createLogger('silent'));
  t = await startTestApp(
    {},
    {
      database: async () => {
        const prisma = createPrisma(url);
        return { prisma, url, embedded: false, close: () => prisma.$disconnect() };
      },
    },
  );
  base = await t.app.start();
  replica = await startStandInReplica({ key: KEY });
  const db = t.app.db.prisma;
  const node = await startReportingNode(db, 'gpu-1');
  stopNode = node.stop;
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
  secret = await t.token('VIEWER', 'an-application');
  const id = (await db.apiToken.findFirst({ where: { name: 'an-application' } }))?.id as string;
  const set = await t.gql(
    'mutation($s: String!) { setLimit(scope: $s, limit: { tokensPerDay: 10000 }) { __typename } }',
    { s: `key:${id}` },
    await t.login(),
  );
  expect(set.data?.setLimit.__typename).toBe('Limit');
}, 120_000);

afterAll(async () => {
  stopNode?.();
  await replica?.close();
  if (down) await startCluster(cluster);
  await t?.close();
  await cluster?.pgCtl('stop', '-m', 'immediate').catch(() => {});
  if (root) await fs.rm(root, { recursive: true, force: true });
});

const client = () => new OpenAI({ baseURL: `${base}/v1`, apiKey: secret, maxRetries: 0 });

async function ask(): Promise<'ok' | { status?: number; message: string }> {
  try {
    const s = await client().chat.completions.create({
      model: 'tiny',
      stream: true,
      max_tokens: 3,
      messages: [{ role: 'user', content: 'hi' }],
    });
    for await (const _ of s);
    return 'ok';
  } catch (err) {
    const e = err as InstanceType<typeof OpenAI.APIError>;
    return { status: e.status, message: e.message };
  }
}

describe('PostgreSQL killed while requests run under a budget', () => {
  it('answers from the slice held, then refuses: never more than the slice', async () => {
    // Traffic, so the process holds a slice (an idle one is given back).
    for (let i = 0; i < 10; i++) expect(await ask()).toBe('ok');
    const kill = killCluster(cluster);
    down = true;
    const after: ('ok' | { status?: number; message: string })[] = [];
    // Requests go on back to back while the database dies and stays away.
    while (after.length < 400) {
      const r = await ask();
      after.push(r);
      if (r !== 'ok' && after.filter((x) => x !== 'ok').length >= 5) break;
    }
    await kill;
    const answered = after.filter((r) => r === 'ok').length;
    const refusals = after.filter((r): r is { status?: number; message: string } => r !== 'ok');
    // Refused well before the budget: what was held, at most, was spent (the budget would allow ~1400 answers).
    expect(refusals.length).toBeGreaterThan(0);
    expect(answered * PER_ANSWER).toBeLessThanOrEqual(MOST_HELD);
    const last = refusals.at(-1);
    expect(last?.status).toBe(429);
    expect(last?.message).toContain('cannot reach its database');
  }, 120_000);
});
