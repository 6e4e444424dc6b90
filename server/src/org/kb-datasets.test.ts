import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { type ReportingNode, startReportingNode } from '../../test/fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { checkTrainData } from '../train/data.js';

// createDataset: a collection's documents turned into question/answer pairs by a served model, called through this
// server's real /v1 (a real socket) under the caller's own API token, so the gateway's rules apply. The model is a
// stand-in replica (test/fixtures/stand-in-replica.ts) that answers fixed pairs about the passage it was sent, in
// a different shape for each document, so the parsing and the flow are both checked.

const KEY = 'engine-key-kb';
let t: TestApp;
let base: string;
let replica: StandInReplica;
let node: ReportingNode;
let admin: string;
let member: string;
let collectionId: string;
const db = () => t.app.db.prisma;
const ERR = '__typename ... on Error { message }';
const DATASET = 'id state chunks chunksDone pairs error notes dataSha256 model documents { name sha256 }';

async function gql(query: string, variables: Record<string, unknown> = {}, token = admin) {
  const r = await t.gql(query, variables, { token });
  expect(r.errors, JSON.stringify(r.errors)).toBeUndefined();
  return r.data as Record<string, any>;
}

async function createDataset(model: string, token = member) {
  const d = await gql(
    `mutation($i: CreateDatasetInput!) { createDataset(input: $i) { ${ERR} ... on KbDataset { ${DATASET} } } }`,
    { i: { collection: collectionId, model, pairsPerChunk: 2 } },
    token,
  );
  return d.createDataset;
}

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  replica = await startStandInReplica({ key: KEY });
  node = await startReportingNode(db(), 'kb-gpu');
  admin = await t.token('ADMIN', 'kb-admin');
  member = await t.token('OPERATOR', 'kb-support-bot');
  await gql(`mutation { createOrg(name: "acme") { ${ERR} } }`);
  await gql(`mutation { createTeam(org: "acme", name: "support") { ${ERR} } }`);
  const sales = (await gql(`mutation { createTeam(org: "acme", name: "sales") { ${ERR} ... on Team { id } } }`))
    .createTeam;
  const key = await db().apiToken.findFirstOrThrow({ where: { name: 'kb-support-bot' } });
  await gql(`mutation($i: AddMemberInput!) { addMember(input: $i) { ${ERR} } }`, {
    i: { org: 'acme', team: 'support', apiToken: key.id },
  });
  // "writer" anyone may call; "sales-writer" only the sales team.
  for (const [name, owner] of [
    ['writer', null],
    ['sales-writer', `team:${sales.id}`],
  ] as const) {
    const model = await db().catalogModel.create({
      data: { name, source: `http://mirror.example/mirror/${name}/v1/model.gguf`, engine: 'llamacpp', owner },
    });
    const r = await db().replica.create({
      data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint: replica.endpoint },
    });
    await db().engineKey.create({ data: { replicaId: r.id, key: KEY } });
  }
  await t.app.services.gateway.routes.refresh();

  collectionId = (
    await gql(
      `mutation { createCollection(input: { org: "acme", name: "handbook", owner: "team:acme/support" }) { ${ERR} ... on Collection { id } } }`,
    )
  ).createCollection.id;
  for (const [name, text] of [
    ['returns.md', '# Returns\n\nReturns are accepted within 30 days. Keep the receipt.'],
    ['warranty.html', '<h1>Warranty</h1><p>Two years of free repairs.</p><script>steal()</script>'],
  ]) {
    const added = await gql(
      `mutation($i: AddDocumentInput!) { addDocument(input: $i) { ${ERR} } }`,
      { i: { collection: collectionId, name, contentBase64: Buffer.from(text as string).toString('base64') } },
      member,
    );
    expect(added.addDocument.__typename).toBe('CollectionDocument');
  }

  // Fixed pairs about the passage each request carries: a fenced JSON array for one document, Q:/A: text for the
  // other, as models answer.
  replica.answer = (body) => {
    const asked = String((body.messages as { content: string }[])[1]?.content ?? '');
    const passage = /<passage>\n([\s\S]*)\n<\/passage>/.exec(asked)?.[1] ?? '';
    const first = passage.split('\n').filter(Boolean).at(-1) ?? '';
    if (asked.includes('"returns.md"')) {
      return `Here you go:\n\`\`\`json\n[{"q": "How long are returns accepted?", "a": "${first}"},\n {"q": "What must be kept?", "a": "The receipt."},]\n\`\`\``;
    }
    return `1. **Q:** How long is the warranty?\n**A:** ${first}\n2. **Q:** What does it cost?\n**A:** Nothing: repairs are free.`;
  };
}, 120_000);

afterAll(async () => {
  node?.stop();
  await replica?.close();
  await t?.close();
});

it("writes pairs from each document's passages with a served model through the gateway, as the caller, and a job records where they came from", async () => {
  const started = await createDataset('writer');
  expect(started).toMatchObject({ __typename: 'KbDataset', state: 'RUNNING', chunks: 2, model: 'writer' });
  await t.app.services.kbDatasets.settled();

  const done = (await gql(`query($id: ID!) { kbDataset(id: $id) { ${DATASET} } }`, { id: started.id }, member))
    .kbDataset;
  const docs = await db().collectionDocument.findMany({ orderBy: { createdAt: 'asc' } });
  expect(done).toMatchObject({
    state: 'DONE',
    chunks: 2,
    chunksDone: 2,
    pairs: 4,
    error: null,
    notes: [],
    documents: docs.map((d) => ({ name: d.name, sha256: d.sha256 })),
  });

  // Through the gateway: the replica saw the engine key (never the caller's token), the passage, the model.
  const asked = replica.requests.slice(-2);
  expect(asked.map((r) => r.authorization)).toEqual([`Bearer ${KEY}`, `Bearer ${KEY}`]);
  expect(asked.map((r) => r.body.model)).toEqual(['writer', 'writer']);
  expect(JSON.stringify(asked[1]?.body.messages)).toContain('Two years of free repairs.');
  expect(JSON.stringify(asked[1]?.body.messages)).not.toContain('steal');

  // The pairs are kept as training data, which the data report accepts, each naming the collection.
  const kept = await fs.readFile(path.join(t.dataDir, 'train', 'data', `${done.dataSha256}.ndjson`), 'utf8');
  expect(kept.split('\n').map((l) => JSON.parse(l))).toEqual([
    {
      q: 'How long are returns accepted?',
      a: 'Returns are accepted within 30 days. Keep the receipt.',
      collection: collectionId,
    },
    { q: 'What must be kept?', a: 'The receipt.', collection: collectionId },
    { q: 'How long is the warranty?', a: 'Two years of free repairs.', collection: collectionId },
    { q: 'What does it cost?', a: 'Nothing: repairs are free.', collection: collectionId },
  ]);
  expect(checkTrainData(kept)).toMatchObject({ pairs: 4, errorCount: 0, collections: [collectionId] });

  // A training job on those pairs names its dataset: the collection, its documents and the model.
  const job = await db().trainJob.create({
    data: {
      name: 'support-lora',
      model: 'writer',
      baseRepo: 'hangar-test/tiny-llama',
      gpuMiB: 1000,
      owner: `team:${(await db().team.findFirstOrThrow({ where: { name: 'support' } })).id}`,
      dataPath: path.join(t.dataDir, 'train', 'data', `${done.dataSha256}.ndjson`),
      dataSha256: done.dataSha256,
      dataBytes: Buffer.byteLength(kept),
      pairs: 4,
    },
  });
  const lineage = await gql(
    `query($id: ID!) { trainJob(id: $id) { dataset { id model collection { name } documents { name } } } }`,
    { id: job.id },
  );
  expect(lineage.trainJob.dataset).toEqual({
    id: started.id,
    model: 'writer',
    collection: { name: 'handbook' },
    documents: [{ name: 'returns.md' }, { name: 'warranty.html' }],
  });
  expect(await db().auditEvent.count({ where: { action: 'createDataset', target: 'handbook' } })).toBe(1);
});

it("stops with the gateway's own refusal when the caller may not call the model, and reads nothing it cannot parse", async () => {
  const before = replica.requests.length;
  const refused = await createDataset('sales-writer');
  await t.app.services.kbDatasets.settled();
  const row = (await gql(`query($id: ID!) { kbDataset(id: $id) { ${DATASET} } }`, { id: refused.id }, member))
    .kbDataset;
  expect(row).toMatchObject({ state: 'FAILED', chunksDone: 0, pairs: 0, dataSha256: null });
  expect(row.error).toMatch(/^returns\.md part 1: the gateway answered 404: The model `sales-writer` does not exist/);
  expect(replica.requests.length).toBe(before);

  // A model that answers prose: nothing to read, said per passage.
  replica.answer = () => 'I would rather not.';
  const prose = await createDataset('writer');
  await t.app.services.kbDatasets.settled();
  const failed = (await gql(`query($id: ID!) { kbDataset(id: $id) { ${DATASET} } }`, { id: prose.id }, member))
    .kbDataset;
  expect(failed).toMatchObject({
    state: 'FAILED',
    chunksDone: 2,
    error: "no pairs could be read from writer's answers",
    notes: [
      'returns.md part 1: no pairs in the answer (it began "I would rather not.")',
      'warranty.html part 1: no pairs in the answer (it began "I would rather not.")',
    ],
  });

  // Another team's operator cannot start one or read one.
  const outsider = await t.token('OPERATOR', 'kb-outsider');
  expect(await createDataset('writer', outsider)).toMatchObject({ __typename: 'NotFoundError' });
  const hidden = await gql(`query($id: ID!) { kbDataset(id: $id) { id } }`, { id: prose.id }, outsider);
  expect(hidden.kbDataset).toBeNull();
});

it('`hangar kb dataset org/collection --model M` follows the dataset and prints the sha256 a training job takes', async () => {
  replica.answer = () => '[{"q": "Is it written?", "a": "Yes."}]';
  const home = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-kb-'));
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, XDG_CONFIG_HOME: _x, ...inherited } = process.env;
  const run = (args: string[]) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const proc = spawn(
        process.execPath,
        [path.resolve(import.meta.dirname, '..', '..', 'bin', 'hangar.mjs'), ...args],
        {
          cwd: os.tmpdir(),
          env: { ...inherited, HOME: home, HANGAR_URL: base, HANGAR_TOKEN: member },
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      let stdout = '';
      let stderr = '';
      proc.stdout.on('data', (d) => {
        stdout += String(d);
      });
      proc.stderr.on('data', (d) => {
        stderr += String(d);
      });
      proc.once('exit', (code) => resolve({ code, stdout, stderr }));
    });

  const r = await run(['kb', 'dataset', 'acme/handbook', '--model', 'writer', '--pairs-per-chunk', '1']);
  expect(r.stderr).toContain('Writing pairs from acme/handbook with writer: 2 passages');
  expect(r.stderr).toContain('2/2 passages, 1 pairs');
  expect(r.stdout).toMatch(
    /^Wrote 1 pairs from 2 documents with writer: data sha256 [0-9a-f]{64}\. A training job takes them as createTrainJob\(input: \{ dataSha256: "[0-9a-f]{64}", … \}\)\.\n$/,
  );
  expect(r.code).toBe(0);

  const missing = await run(['kb', 'dataset', 'acme/nothing', '--model', 'writer']);
  expect(missing).toMatchObject({
    code: 4,
    stderr: expect.stringContaining('no collection acme/nothing (hangar org ls lists them)'),
  });
  const refused = await run(['kb', 'dataset', 'acme/handbook', '--model', 'sales-writer']);
  expect(refused.code).toBe(1);
  expect(refused.stderr).toContain('the dataset failed: returns.md part 1: the gateway answered 404');
}, 120_000);

it('says a dataset its server left behind failed, rather than RUNNING for good, and one cut by a stop the same', async () => {
  // A server killed mid-run (kill -9) leaves its row RUNNING: the next sweep fails it once it has stopped moving.
  const left = await db().kbDataset.create({
    data: { collectionId, model: 'writer', chunks: 3, documents: [], createdBy: 'test', state: 'RUNNING' },
  });
  await db()
    .$executeRaw`UPDATE "KbDataset" SET "updatedAt" = now() - interval '20 minutes' WHERE id = ${left.id}::uuid`;
  const moving = await db().kbDataset.create({
    data: { collectionId, model: 'writer', chunks: 3, documents: [], createdBy: 'test', state: 'RUNNING' },
  });
  await db().$executeRaw`UPDATE "KbDataset" SET "updatedAt" = now() WHERE id = ${moving.id}::uuid`;
  // This server's own clock half an hour ahead (an NTP step) must not make the moving one look stale: rows move on
  // the database's clock and are judged on it.
  vi.useFakeTimers({ toFake: ['Date'], now: Date.now() + 30 * 60_000 });
  try {
    expect(await t.app.services.kbDatasets.sweep()).toBe(1);
  } finally {
    vi.useRealTimers();
  }
  expect(await db().kbDataset.findUniqueOrThrow({ where: { id: left.id } })).toMatchObject({
    state: 'FAILED',
    error: 'its server stopped while it ran (no progress for 15 minutes): start the dataset again',
  });
  // One still moving (another server writing it) is left alone.
  expect((await db().kbDataset.findUniqueOrThrow({ where: { id: moving.id } })).state).toBe('RUNNING');
  await db().kbDataset.delete({ where: { id: moving.id } });

  // A graceful stop fails what this process was writing at once, saying the server stopped.
  const release = replica.hold();
  const started = await createDataset('writer');
  expect(started.state).toBe('RUNNING');
  await t.app.services.kbDatasets.stop();
  release();
  await t.app.services.kbDatasets.settled();
  expect(await db().kbDataset.findUniqueOrThrow({ where: { id: started.id } })).toMatchObject({
    state: 'FAILED',
    error: 'the server stopped while it ran: start the dataset again',
  });
});
