import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ReportingNode, startReportingNode } from '../../test/fixtures/reporting-node.js';
import { until } from '../../test/fixtures/server-process.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { recordAllSql } from '../../test/sql-count.js';

// The placement pass follows what changes (placement-schedule.ts) instead of reading the whole catalog and fleet
// every few seconds: an idle server with many models placed reads none of it, and a change is placed as soon as
// it is heard. The safety pass is set a day apart, so whatever is placed here came by an event, the nodes' look or
// time. The changes are written to a real PostgreSQL as another server (or its mutation) would commit them: this
// server learns of them only from the database, through the triggers' events or its look at the nodes.

const MODELS = 40;

let t: TestApp;
let nodes: ReportingNode[] = [];
const db = () => t.app.db.prisma;

/** The statements that read the catalog or the fleet's replicas whole: the placement pass's reads (and the old
 * scaling loop's, which read every model each tick whether or not any was autoscaled). */
const wholeReads = (statements: string[]) =>
  statements.filter(
    (s) =>
      /^SELECT/.test(s) &&
      /FROM "public"\."(CatalogModel|Replica)"/.test(s) &&
      !/"targetInFlight" IS NOT NULL/.test(s) &&
      !/"modelId" IN|"id" IN|"id" = \$/.test(s),
  );

const placedOn = async (modelName: string) =>
  (
    await db().replica.findMany({
      where: { model: { name: modelName }, desired: 'RUN', state: { in: ['PENDING', 'LOADING', 'READY'] } },
    })
  ).map((r) => r.nodeId);

beforeAll(async () => {
  t = await startTestApp({ HANGAR_PLACEMENT_REREAD_SECONDS: '86400' });
  nodes = [await startReportingNode(db(), 'cpu-a'), await startReportingNode(db(), 'cpu-b')];
  // Both run llama.cpp on their CPU (no GPU): each takes one replica of any number of models.
  await db().node.updateMany({ data: { engines: [{ name: 'llama.cpp', version: 'test', build: 6000 }] } });
  // Many models, each wanting one replica (ALWAYS): placed by the first pass, at start.
  await db().catalogModel.createMany({
    data: Array.from({ length: MODELS }, (_, i) => ({
      name: `always-${i}`,
      source: `http://mirror.example/mirror/always-${i}/v1/model.gguf`,
      engine: 'llamacpp' as const,
      minReplicas: 1,
      maxReplicas: 1,
    })),
  });
  await t.app.start();
  await until(
    'the models placed',
    async () => ((await db().replica.count({ where: { nodeId: { not: null } } })) === MODELS ? true : undefined),
    30_000,
  );
  // The pass that placed them wrote replicas, whose events ask for one more pass (which finds nothing to do).
  await settled();
});

/** Until a second goes by without a pass (the events of a change, and of the pass's own writes, are spent). */
const settled = () =>
  until(
    'the passes settled',
    async () =>
      wholeReads((await recordAllSql(() => new Promise((r) => setTimeout(r, 1000)))).statements).length
        ? undefined
        : true,
    30_000,
  );

afterAll(async () => {
  for (const n of nodes) n.stop();
  await t?.close();
});

describe('the placement pass follows changes', () => {
  it('reads neither the catalog nor the replicas while nothing changes', async () => {
    // Longer than the look (5 s): the pass used to read everything at every look.
    const { statements } = await recordAllSql(() => new Promise((r) => setTimeout(r, 6500)));
    expect(wholeReads(statements)).toEqual([]);
    // The look itself went on: the nodes' small read.
    expect(statements.some((s) => /FROM "public"\."Node"/.test(s))).toBe(true);
  });

  it('places a model set to ALWAYS as soon as its change is heard', async () => {
    await db().catalogModel.create({
      data: {
        name: 'woken-later',
        source: 'http://mirror.example/mirror/woken-later/v1/model.gguf',
        engine: 'llamacpp',
        minReplicas: 0,
        maxReplicas: 1,
      },
    });
    // On demand and asleep: nothing to place.
    await new Promise((r) => setTimeout(r, 300));
    expect(await placedOn('woken-later')).toEqual([]);
    await db().catalogModel.update({ where: { name: 'woken-later' }, data: { minReplicas: 1 } });
    // Bounded wait, no speed asserted: without the event it would wait for the safety pass, a day away.
    await until(
      'the model placed',
      async () => ((await placedOn('woken-later')).some((n) => n !== null) ? true : undefined),
      15_000,
    );
    const [node] = await placedOn('woken-later');
    expect(nodes.map((n) => n.id)).toContain(node);
  });

  it('takes a lost node’s replicas as lost and places them on the node left, without the safety pass', async () => {
    const [a, b] = nodes as [ReportingNode, ReportingNode];
    const onA = await db().replica.findMany({ where: { nodeId: a.id, state: { in: ['PENDING', 'READY'] } } });
    expect(onA.length).toBeGreaterThan(0);
    // Replicas it serves: lost when it goes, rather than unplaced as a pending one is.
    await db().replica.updateMany({ where: { nodeId: a.id }, data: { state: 'READY' } });
    // Their events are spent before the node goes: what follows is heard by the look at the nodes alone.
    await settled();
    // Node a stops reporting: its last report falls out of the 30 s window (no event says so).
    a.stop();
    await db().$executeRaw`UPDATE "Node" SET "lastSeenAt" = now() - interval '31 seconds' WHERE id = ${a.id}::uuid`;
    await until(
      'the replicas lost and placed again',
      async () =>
        (await db().replica.count({ where: { nodeId: a.id, state: 'LOST' } })) === onA.length &&
        (await db().replica.count({ where: { nodeId: b.id, desired: 'RUN', state: 'PENDING' } })) >= MODELS
          ? true
          : undefined,
      20_000,
    );
    const lost = await db().replica.findMany({ where: { nodeId: a.id, state: 'LOST' } });
    expect(lost.map((r) => r.message)).toEqual(lost.map(() => 'node cpu-a stopped reporting'));
  });
});
