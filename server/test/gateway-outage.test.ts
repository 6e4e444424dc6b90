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

// PostgreSQL killed while the gateway serves (`pg_ctl stop -m immediate` on a cluster of this file's own): the
// gateway routes from what it holds in memory (the route table, the callers it saw lately), so an application's
// requests go on being answered; what truly needs the database (a caller not seen lately, waking a model) is
// answered in OpenAI's shape with Retry-After, which the official client reads, never Hangar's own 500.

const KEY = 'hgk_gateway-outage-engine-key-0123456789abcdef';

let root: string;
let cluster: Cluster;
let stopNode: (() => void) | undefined;
let down = false;
let t: TestApp;
let base: string;
let replica: StandInReplica;

beforeAll(async () => {
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  root = path.join(os.tmpdir(), `hangar-gateway-outage-${process.pid}-${randomBytes(3).toString('hex')}`);
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
  // A node that keeps reporting: one that never does is offline, and placement would take its replica as lost.
  const node = await startReportingNode(db, 'gpu-1');
  stopNode = node.stop;
  const model = await db.catalogModel.create({
    data: { name: 'tiny', source: 'http://mirror.example/mirror/tiny/v1/model.gguf', engine: 'llamacpp' },
  });
  const r = await db.replica.create({
    data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
  });
  await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });
  await db.catalogModel.create({
    data: {
      name: 'sleepy',
      source: 'http://mirror.example/mirror/sleepy/v1/model.gguf',
      engine: 'llamacpp',
      minReplicas: 0,
      maxReplicas: 1,
    },
  });
  await t.app.services.gateway.routes.refresh();
}, 120_000);

afterAll(async () => {
  stopNode?.();
  await replica?.close();
  if (down) await startCluster(cluster);
  await t?.close();
  await cluster?.pgCtl('stop', '-m', 'immediate').catch(() => {});
  if (root) await fs.rm(root, { recursive: true, force: true });
});

const client = (apiKey: string) => new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });

async function chat(apiKey: string, model = 'tiny'): Promise<string> {
  const answer = await client(apiKey).chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
  });
  let text = '';
  for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}

/** What a request that could not be served got: its status, OpenAI's error body and Retry-After. */
async function refusal(work: Promise<unknown>) {
  const err = await work.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(OpenAI.APIError);
  const e = err as InstanceType<typeof OpenAI.APIError>;
  return { status: e.status, error: e.error, retryAfter: e.headers?.get('retry-after') };
}

async function readyz(): Promise<number> {
  return (await fetch(`${base}/readyz`)).status;
}

describe('PostgreSQL killed while the gateway serves', () => {
  it('serves the callers it knows from memory, and answers the rest in OpenAI’s shape with Retry-After', async () => {
    const known = await t.token('VIEWER', 'an-application');
    const unseen = await t.token('VIEWER', 'not-seen-before-the-outage');
    expect(await chat(known)).toBe(replica.words.join(''));

    await killCluster(cluster);
    down = true;
    await expect.poll(readyz, { timeout: 15_000 }).toBe(503);

    // An application's requests go on, a few at a time, as they would: all of them are answered.
    const statuses: string[] = [];
    for (let round = 0; round < 6; round++) {
      const answers = await Promise.all(
        Array.from({ length: 5 }, () => chat(known).catch((e: unknown) => `failed: ${String(e)}`)),
      );
      statuses.push(...answers);
    }
    expect(statuses.filter((s) => s !== replica.words.join(''))).toEqual([]);
    const listed = await client(known).models.list();
    expect(listed.data.map((m) => m.id)).toContain('tiny');

    // A caller not seen lately cannot be told from a stranger without the database: told to come back.
    const stranger = await refusal(chat(unseen));
    expect(stranger.status).toBe(503);
    expect(stranger.error).toMatchObject({ message: expect.any(String), type: 'server_error' });
    expect(stranger.retryAfter).toBeTruthy();
    // Waking a model is written to the database first.
    const woken = await refusal(chat(known, 'sleepy'));
    expect(woken.status).toBe(503);
    expect(woken.error).toMatchObject({ message: expect.any(String), type: 'server_error' });
    expect(woken.retryAfter).toBeTruthy();

    await startCluster(cluster);
    down = false;
    await expect.poll(readyz, { timeout: 30_000 }).toBe(200);
    // And a caller not seen before is identified again (the catalog's own loops may meanwhile re-place `tiny`,
    // whose node here never reports: what is checked is identification, which needs the database).
    expect((await client(unseen).models.list()).data.map((m) => m.id)).toContain('tiny');
  }, 90_000);
});
