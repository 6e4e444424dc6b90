import { type Client, createClient } from 'graphql-ws';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { notify } from '../src/pubsub.js';
import { startTestApp, type TestApp } from './harness.js';
import { recordAllSql } from './sql-count.js';

// An event is read once and handed to every subscriber allowed to see it: at 1000 subscribers each one re-read
// the same row, 1000 reads an event, and the delay and the memory grew with them. Counted over real graphql-ws
// connections: the statements one event costs are the same for 1 subscriber as for 20.

let t: TestApp;
let wsUrl: string;
const clients: Client[] = [];
beforeAll(async () => {
  t = await startTestApp();
  wsUrl = `${(await t.app.start()).replace('http', 'ws')}/graphql`;
  await t.app.db.prisma.mirrorFile.create({
    data: {
      model: 'shared',
      version: 'v1',
      file: 'model.gguf',
      sourceUrl: 'https://hub.example/shared/model.gguf',
      state: 'PRESENT',
      bytesDone: 10n,
      bytesTotal: 10n,
    },
  });
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.dispose()));
  await t.close();
});

function connect(token: string): Client {
  const client = createClient({
    url: wsUrl,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${token}` },
    retryAttempts: 0,
  });
  clients.push(client);
  return client;
}

const SUB = 'subscription { mirrorChanged { id state fileCount usedBy { name } } }';
type Heard = { events: number; errors: string[]; done: boolean };

function subscribe(client: Client): Heard {
  const heard: Heard = { events: 0, errors: [], done: false };
  client.subscribe<{ mirrorChanged: { id: string } }>(
    { query: SUB },
    {
      next: (v) => {
        if (v.errors?.length) heard.errors.push(v.errors[0]!.message);
        else if (v.data?.mirrorChanged.id === 'shared/v1') heard.events++;
      },
      error: (e) => heard.errors.push(String((e as Error)?.message ?? e)),
      complete: () => {
        heard.done = true;
      },
    },
  );
  return heard;
}

async function until(what: string, ok: () => boolean, tries = 500) {
  for (let i = 0; i < tries; i++) {
    if (ok()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`still waiting: ${what}`);
}

/** Events until every subscriber has heard one (graphql-ws says nothing when a subscription is in place). */
async function settle(subs: Heard[]) {
  for (let i = 0; i < 50; i++) {
    const before = subs.map((s) => s.events);
    await notify(t.app.db.prisma, 'mirrorVersion', 'shared/v1');
    try {
      await until('every subscriber hears an event', () => subs.every((s, k) => s.events > before[k]!), 30);
      return;
    } catch {}
  }
  throw new Error('the subscriptions never all heard an event');
}

/** The statements one event costs the subscriptions, and that each subscriber heard it. */
async function oneEvent(subs: Heard[]) {
  const before = subs.map((s) => s.events);
  const { statements } = await recordAllSql(async () => {
    await notify(t.app.db.prisma, 'mirrorVersion', 'shared/v1');
    await until('every subscriber hears the event', () => subs.every((s, k) => s.events === before[k]! + 1));
    // Anything late would show in the count.
    await new Promise((r) => setTimeout(r, 200));
  });
  // The subscription's reads: the version's files and the catalog's uses (the loops' own statements aside).
  return statements.filter(
    (q) => /^SELECT/i.test(q) && (/FROM "public"\."MirrorFile"/.test(q) || q.includes("LIKE '%/mirror/%'")),
  );
}

describe('one read per event, shared by its subscribers', () => {
  let one: string[];

  it('one subscriber: the version and its uses, read once each', async () => {
    const sub = subscribe(connect(await t.token('VIEWER', 'alone')));
    await settle([sub]);
    one = await oneEvent([sub]);
    expect(one).toHaveLength(2);
  });

  it('20 subscribers of five callers on 5 connections: the same statements, and every one hears it', async () => {
    const subs: Heard[] = [];
    for (let c = 0; c < 5; c++) {
      const client = connect(await t.token('VIEWER', `many-${c}`));
      for (let k = 0; k < 4; k++) subs.push(subscribe(client));
    }
    await settle(subs);
    const many = await oneEvent(subs);
    expect(many).toHaveLength(one.length);
    expect(subs.every((s) => s.errors.length === 0)).toBe(true);
  });

  it('a subscriber whose token is revoked hears nothing more, while the others still get the shared read', async () => {
    const kept = subscribe(connect(await t.token('VIEWER', 'kept')));
    const revoked = subscribe(connect(await t.token('VIEWER', 'revoked')));
    await settle([kept, revoked]);
    const token = await t.app.db.prisma.apiToken.findFirstOrThrow({ where: { name: 'revoked' } });
    const admin = await t.login();
    const r = await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: token.id }, admin);
    expect(r.data?.revokeApiToken.__typename).toBe('ApiToken');
    await until('the revoked subscription ends', () => revoked.done || revoked.errors.length > 0);
    const heardBefore = revoked.events;
    await oneEvent([kept]);
    expect(revoked.events).toBe(heardBefore);
  });
});

/** The results sent since `before`, by how they were made (metrics/metrics.ts). */
async function results(): Promise<{ executed: number; shared: number }> {
  const metric = t.app.metrics.registry.getSingleMetric('hangar_graphql_subscription_results_total');
  const values = (await metric?.get())?.values ?? [];
  const of = (how: string) => values.find((v) => v.labels.how === how)?.value ?? 0;
  return { executed: of('executed'), shared: of('shared') };
}

describe('one execution per event, shared by the subscribers who would get the same answer', () => {
  // Each test counts every result the server sends, so it starts with none but its own subscriptions open.
  const closeAll = async () => {
    await Promise.all(clients.splice(0).map((c) => c.dispose()));
    await new Promise((r) => setTimeout(r, 300));
  };
  beforeEach(closeAll);
  it("one caller's 10 subscriptions on two connections: executed once an event, the other 9 handed the result", async () => {
    const token = await t.token('VIEWER', 'tabs');
    const subs: Heard[] = [];
    for (const client of [connect(token), connect(token)]) for (let k = 0; k < 5; k++) subs.push(subscribe(client));
    await settle(subs);
    // Wait for the settling events to be all sent: the counters below must count one event alone.
    await new Promise((r) => setTimeout(r, 300));
    const before = await results();
    await oneEvent(subs);
    const after = await results();
    expect(after.executed - before.executed).toBe(1);
    expect(after.shared - before.shared).toBe(9);
    expect(subs.every((s) => s.errors.length === 0)).toBe(true);
  });

  it('two callers, or one caller with two documents, are executed apart: nobody gets an answer made for another', async () => {
    const viewer = await t.token('VIEWER', 'apart-viewer');
    const admin = await t.token('ADMIN', 'apart-admin');
    const subs = [subscribe(connect(viewer)), subscribe(connect(admin))];
    const other = connect(viewer);
    const withFiles: Heard = { events: 0, errors: [], done: false };
    other.subscribe<{ mirrorChanged: { id: string; files: { file: string }[] } }>(
      { query: 'subscription { mirrorChanged { id files { file } } }' },
      {
        next: (v) => {
          if (v.errors?.length) withFiles.errors.push(v.errors[0]!.message);
          else if (v.data?.mirrorChanged.files[0]?.file === 'model.gguf') withFiles.events++;
        },
        error: (e) => withFiles.errors.push(String(e)),
        complete: () => {},
      },
    );
    subs.push(withFiles);
    await settle(subs);
    await new Promise((r) => setTimeout(r, 300));
    const before = await results();
    await oneEvent(subs);
    const after = await results();
    expect(after.executed - before.executed).toBe(3);
    expect(after.shared - before.shared).toBe(0);
    expect(withFiles.errors).toEqual([]);
  });
});
