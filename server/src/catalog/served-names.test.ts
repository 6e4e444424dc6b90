import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { reportGpu, type TrainingWorld, tarOf, trainingWorld, writeAdapterDir } from '../../test/fixtures/training.js';
import { freshDatabase, startTestApp, type TestApp } from '../../test/harness.js';
import { createApp } from '../app.js';
import { ConfigError, loadConfig } from '../config.js';
import { migrate, migrationsDir, readMigrations } from '../db/migrate.js';

// Models and adapters share one namespace: a request names one or the other. The attack: an operator of another
// team serves a model under a team adapter's name, and from then on the team's requests for its adapter are
// answered by the operator's model. Every write that creates a model or an adapter is refused a name the other
// kind holds, atomically (a race of two writers leaves exactly one), and the refusal names the holder only to
// those who may see it.

let t: TestApp;
let hub: FakeHub;
let base: string;
let w: TrainingWorld;
let memberOperator: string;
let outsideOperator: string;
let teamPairs: string;

const CREATE = `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename
  ... on TrainJob { id name owner } ... on Error { message } } }`;
const CLAIM = `mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }`;
const FINISH = `mutation($id: ID!) { finishTrainJob(id: $id, state: DONE) { __typename ... on Error { message } } }`;
const PUBLISH = `mutation($id: ID!) { publishTrainJob(id: $id) { __typename
  ... on TrainJobPublished { adapter owner } ... on Error { message } } }`;
const SERVE = `mutation($name: String!) { serveMirrorVersion(model: "tiny", version: "v1", name: $name, mode: STOPPED) {
  __typename ... on ServePlaced { model { name } } ... on Error { message } } }`;
const common = { model: 'tiny', baseRepo: 'hangar-test/tiny-llama', node: 'gpu-1', gpuMiB: 8000 };

/** A job of the team's, trained to the end on gpu-1 (DONE, its adapter uploaded), not yet published. */
async function trainedJob(name: string): Promise<{ id: string; name: string }> {
  const created = (await t.gql(CREATE, { i: { ...common, name, data: teamPairs } }, { token: memberOperator })).data
    ?.createTrainJob;
  expect(created.__typename).toBe('TrainJob');
  await reportGpu(t, w.nodeToken, 20_000);
  expect((await t.gql(CLAIM, { id: created.id }, { token: w.nodeToken })).data?.claimTrainJob.__typename).toBe(
    'TrainClaim',
  );
  const up = await fetch(`${base}/api/train/jobs/${created.id}/artifacts/peft`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${w.nodeToken}`, 'content-type': 'application/gzip' },
    body: new Uint8Array(await tarOf(await writeAdapterDir())),
  });
  expect(up.status).toBe(200);
  expect((await t.gql(FINISH, { id: created.id }, { token: w.nodeToken })).data?.finishTrainJob.__typename).toBe(
    'TrainJob',
  );
  return { id: created.id, name };
}

beforeAll(async () => {
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
  const p = t.app.db.prisma;
  const org = await p.org.create({ data: { name: 'acme' } });
  const secret = await p.team.create({ data: { orgId: org.id, name: 'secret' } });
  const sales = await p.team.create({ data: { orgId: org.id, name: 'sales' } });
  const collection = await p.collection.create({
    data: { name: 'secret-handbook', ownerScope: 'team', ownerId: secret.id, orgId: org.id },
  });
  const member = async (name: string, teamId: string) => {
    const token = await t.token('OPERATOR', name);
    const row = await p.apiToken.findFirstOrThrow({ where: { name } });
    await p.membership.create({ data: { orgId: org.id, teamId, apiTokenId: row.id } });
    return token;
  };
  memberOperator = await member('secret-operator', secret.id);
  outsideOperator = await member('sales-operator', sales.id);
  teamPairs = Array.from({ length: 6 }, (_, i) =>
    JSON.stringify({ q: `Secret ${i}?`, a: `Answer ${i}.`, collection: collection.id }),
  ).join('\n');
  // The team's adapter, owned by team acme/secret (its pairs come from the team's collection).
  const job = await trainedJob('secret-adapter');
  const pub = (await t.gql(PUBLISH, { id: job.id }, { token: memberOperator })).data?.publishTrainJob;
  expect(pub).toMatchObject({ __typename: 'TrainJobPublished', adapter: 'secret-adapter' });
  expect(pub.owner).toMatch(/^team:/);
}, 120_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

describe('one namespace for models and adapters', () => {
  it("refuses an outsider operator's serveMirrorVersion under a team adapter's name, without saying whose it is", async () => {
    const r = await t.gql(SERVE, { name: 'secret-adapter' }, { token: outsideOperator });
    expect(r.data?.serveMirrorVersion).toEqual({
      __typename: 'ConflictError',
      message: 'the name secret-adapter is taken: choose another name',
    });
    expect(await t.app.db.prisma.catalogModel.findUnique({ where: { name: 'secret-adapter' } })).toBeNull();
    // The team, and an admin, are told who holds it.
    for (const token of [memberOperator, w.admin]) {
      const told = await t.gql(SERVE, { name: 'secret-adapter' }, { token });
      expect(told.data?.serveMirrorVersion).toEqual({
        __typename: 'ConflictError',
        message: "secret-adapter is already tiny's adapter (owned by team:acme/secret): choose another name",
      });
    }
  });

  it('refuses publishTrainJob to a name a model took after the job was made, and leaves nothing in the mirror', async () => {
    const job = await trainedJob('taken-later');
    const served = await t.gql(SERVE, { name: 'taken-later' }, { token: outsideOperator });
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    const pub = await t.gql(PUBLISH, { id: job.id }, { token: memberOperator });
    expect(pub.data?.publishTrainJob).toEqual({
      __typename: 'ConflictError',
      message: 'the catalog already has a model named taken-later: train under another name',
    });
    expect(await t.app.db.prisma.adapter.findUnique({ where: { name: 'taken-later' } })).toBeNull();
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'taken-later' } })).toBe(0);
  });

  it('lets exactly one of a model and an adapter racing for a name have it, run in parallel', async () => {
    const names = ['race-0', 'race-1', 'race-2'];
    const jobs = [];
    for (const name of names) jobs.push(await trainedJob(name));
    const results = await Promise.all(
      jobs.map((job) =>
        Promise.all([
          t.gql(PUBLISH, { id: job.id }, { token: memberOperator }).then((r) => r.data?.publishTrainJob),
          t.gql(SERVE, { name: job.name }, { token: outsideOperator }).then((r) => r.data?.serveMirrorVersion),
        ]),
      ),
    );
    const p = t.app.db.prisma;
    for (const [i, [published, served]] of results.entries()) {
      const name = names[i] as string;
      const won = [published.__typename, served.__typename].filter((n) => n !== 'ConflictError');
      expect(won, `${name}: ${JSON.stringify([published, served])}`).toHaveLength(1);
      const loser = published.__typename === 'ConflictError' ? published : served;
      expect(loser.__typename).toBe('ConflictError');
      const rows = (await p.catalogModel.count({ where: { name } })) + (await p.adapter.count({ where: { name } }));
      expect(rows).toBe(1);
      // A publish that lost keeps nothing in the mirror either: it can be published under another name later.
      if (published.__typename === 'ConflictError')
        expect(await p.mirrorFile.count({ where: { model: name } })).toBe(0);
    }
  });

  it('answers the second of two models racing for a name with a ConflictError, not an unexpected error', async () => {
    const both = await Promise.all(
      [outsideOperator, memberOperator].map((token) =>
        t.gql(SERVE, { name: 'twice' }, { token }).then((r) => r.data?.serveMirrorVersion ?? r.errors),
      ),
    );
    expect(both.map((r) => r.__typename).sort()).toEqual(['ConflictError', 'ServePlaced']);
  });

  it('is held by the database, whoever writes: a row under the other kind’s name is refused, a rename too', async () => {
    const p = t.app.db.prisma;
    const tiny = await p.catalogModel.findUniqueOrThrow({ where: { name: 'tiny' } });
    await expect(
      p.catalogModel.create({ data: { name: 'secret-adapter', source: 'http://m/x.gguf', engine: 'llamacpp' } }),
    ).rejects.toMatchObject({ code: 'P2002' });
    await expect(
      p.adapter.create({ data: { name: 'tiny', source: 'http://m/a.gguf', modelId: tiny.id } }),
    ).rejects.toMatchObject({ code: 'P2002' });
    const other = await p.catalogModel.create({
      data: { name: 'renamed-later', source: 'http://m/y.gguf', engine: 'llamacpp' },
    });
    await expect(
      p.catalogModel.update({ where: { id: other.id }, data: { name: 'secret-adapter' } }),
    ).rejects.toMatchObject({ code: 'P2002' });
    // A rename frees the old name and claims the new one; removing the row frees its name.
    await p.catalogModel.update({ where: { id: other.id }, data: { name: 'renamed-again' } });
    expect(await p.servedName.findUnique({ where: { name: 'renamed-again' } })).toMatchObject({ kind: 'MODEL' });
    expect(await p.servedName.findUnique({ where: { name: 'renamed-later' } })).toBeNull();
    await p.catalogModel.delete({ where: { id: other.id } });
    expect(await p.servedName.findUnique({ where: { name: 'renamed-again' } })).toBeNull();
  });

  it("refuses a hangar.yaml model named like a team's adapter, at start, naming the entry", async () => {
    const file = path.join(t.dataDir, 'hangar.yaml');
    await fs.writeFile(
      file,
      'models:\n  - name: free-name\n    source: http://mirror.example/m.gguf\n    engine: llamacpp\n  - name: secret-adapter\n    source: http://mirror.example/m.gguf\n    engine: llamacpp\n',
    );
    const config = loadConfig({
      HANGAR_DATA_DIR: t.dataDir,
      HANGAR_CONFIG: file,
      HANGAR_LOG_LEVEL: 'silent',
      PORT: '0',
    });
    const failed = await createApp({ config, log: createLogger('silent'), database: t.app.db, print: () => {} }).catch(
      (e: unknown) => e,
    );
    expect(failed).toBeInstanceOf(ConfigError);
    expect((failed as Error).message).toBe(
      `HANGAR_CONFIG=${file}: models.1.name: secret-adapter is already tiny's adapter (owned by team:acme/secret): rename the entry`,
    );
    const p = t.app.db.prisma;
    expect(await p.catalogModel.count({ where: { name: { in: ['free-name', 'secret-adapter'] } } })).toBe(0);
  });
});

describe('names that two rows held before the constraint', () => {
  let replicaA: StandInReplica;
  let replicaB: StandInReplica;
  const KEY = 'hgk_served-names-test-engine-key-0123456789';

  beforeAll(async () => {
    replicaA = await startStandInReplica({ key: KEY });
    replicaB = await startStandInReplica({ key: KEY });
  });
  afterAll(async () => {
    await replicaA?.close();
    await replicaB?.close();
  });

  it("route a team's adapter to the adapter, never to the model that took its name", async () => {
    const p = t.app.db.prisma;
    const team = await p.team.findFirstOrThrow({ where: { name: 'secret' } });
    const node = await p.node.create({ data: { name: 'gpu-old', tokenHash: 'not-a-real-hash' } });
    // As a database written before the constraint holds them: the team's adapter on its base model, and then an
    // outsider's model under the adapter's name, each with a READY replica. Triggers are off for these writes.
    await p.$transaction(async (tx) => {
      await tx.$executeRaw`SET LOCAL session_replication_role = replica`;
      const teamBase = await tx.catalogModel.create({
        data: { name: 'old-base', source: 'http://mirror.example/mirror/old-base/v1/m.gguf', engine: 'llamacpp' },
      });
      await tx.adapter.create({
        data: {
          name: 'old-adapter',
          source: 'http://mirror.example/mirror/old-adapter/v1/a.gguf',
          modelId: teamBase.id,
          owner: `team:${team.id}`,
        },
      });
      const a = await tx.replica.create({
        data: {
          modelId: teamBase.id,
          nodeId: node.id,
          state: 'READY',
          endpoint: replicaA.endpoint,
          adapters: ['old-adapter'],
        },
      });
      const hijack = await tx.catalogModel.create({
        data: { name: 'old-adapter', source: 'http://mirror.example/mirror/x/v1/m.gguf', engine: 'llamacpp' },
      });
      const b = await tx.replica.create({
        data: { modelId: hijack.id, nodeId: node.id, state: 'READY', endpoint: replicaB.endpoint },
      });
      await tx.engineKey.createMany({ data: [a, b].map((r) => ({ replicaId: r.id, key: KEY })) });
    });
    await t.app.services.gateway.routes.refresh();
    const viewer = await t.token('VIEWER', 'secret-viewer');
    const row = await p.apiToken.findFirstOrThrow({ where: { name: 'secret-viewer' } });
    await p.membership.create({ data: { orgId: team.orgId, teamId: team.id, apiTokenId: row.id } });
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${viewer}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'old-adapter', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.text();
    expect(res.status).toBe(200);
    // The team base's replica answered, with the adapter applied; the hijacking model's replica heard nothing.
    expect(replicaA.requests).toHaveLength(1);
    expect(replicaA.requests[0]?.body).toMatchObject({ model: 'old-adapter', lora: [{ id: 0, scale: 1 }] });
    expect(replicaB.requests).toHaveLength(0);
    // /v1/models lists the name once, as the adapter.
    const card = await fetch(`${base}/v1/models/old-adapter`, { headers: { authorization: `Bearer ${viewer}` } });
    expect(await card.json()).toMatchObject({ id: 'old-adapter', parent: 'old-base' });
    const list = (await (
      await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${viewer}` } })
    ).json()) as { data: { id: string }[] };
    expect(list.data.filter((c) => c.id === 'old-adapter')).toHaveLength(1);
  });
});

describe('the served_names migration', () => {
  it('gives a name a model and an adapter both held to the adapter, and records it in the audit log', async () => {
    const db = await freshDatabase();
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-migrations-'));
    try {
      await c.query('DROP SCHEMA public CASCADE; CREATE SCHEMA public;');
      // Every migration before this one, then rows as a database of that time could hold them.
      const ours = (await readMigrations()).findIndex((m) => m.name.endsWith('_served_names'));
      expect(ours).toBeGreaterThan(0);
      for (const m of (await readMigrations()).slice(0, ours)) {
        await fs.cp(path.join(migrationsDir, m.name), path.join(dir, m.name), { recursive: true });
      }
      await fs.copyFile(path.join(migrationsDir, 'migration_lock.toml'), path.join(dir, 'migration_lock.toml'));
      const log = createLogger('silent');
      await migrate(db.url, log, dir);
      await c.query(`
        INSERT INTO "CatalogModel" (id, name, source, engine, "updatedAt") VALUES
          ('00000000-0000-4000-8000-000000000001', 'base', 'http://m/base.gguf', 'llamacpp', now()),
          ('00000000-0000-4000-8000-000000000002', 'clash', 'http://m/clash.gguf', 'llamacpp', now());
        INSERT INTO "Adapter" (id, name, source, owner, "modelId") VALUES
          ('00000000-0000-4000-8000-000000000003', 'clash', 'http://m/clash-a.gguf', 'team:00000000-0000-4000-8000-000000000009', '00000000-0000-4000-8000-000000000001'),
          ('00000000-0000-4000-8000-000000000004', 'own', 'http://m/own-a.gguf', NULL, '00000000-0000-4000-8000-000000000001');`);
      await migrate(db.url, log);
      const names = await c.query('SELECT name, kind::text, "modelId", "adapterId" FROM "ServedName" ORDER BY name');
      expect(names.rows).toEqual([
        { name: 'base', kind: 'MODEL', modelId: '00000000-0000-4000-8000-000000000001', adapterId: null },
        { name: 'clash', kind: 'ADAPTER', modelId: null, adapterId: '00000000-0000-4000-8000-000000000003' },
        { name: 'own', kind: 'ADAPTER', modelId: null, adapterId: '00000000-0000-4000-8000-000000000004' },
      ]);
      const audit = await c.query(`SELECT actor, action, target, outcome::text, message FROM "AuditEvent"`);
      expect(audit.rows).toEqual([
        {
          actor: 'system:migration',
          action: 'servedNameClash',
          target: 'clash',
          outcome: 'DONE',
          message:
            'a model and an adapter both had this name: the adapter keeps it and requests for it go to the adapter. The model (id 00000000-0000-4000-8000-000000000002) is no longer called by it: remove it and serve it again under another name',
        },
      ]);
    } finally {
      await c.end();
      await fs.rm(dir, { recursive: true, force: true });
      await db.close();
    }
  });
});
