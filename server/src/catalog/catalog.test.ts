import fs from 'node:fs/promises';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { createApp } from '../app.js';
import { ConfigError, loadConfig } from '../config.js';
import { PLACEMENT_LOCK } from '../fleet/fleet-placement.js';

let t: TestApp;
let base: string;
let operator: string;
let nodeToken: string;
const gguf = new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url);

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  operator = await t.token('OPERATOR', 'catalog-ops');
  const body = await fs.readFile(gguf);
  for (const v of ['v1', 'v2']) {
    const put = await fetch(`${base}/mirror/llama-vocab/${v}/model.gguf`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: new Uint8Array(body),
    });
    expect(put.status).toBe(201);
  }
  const admin = await t.token('ADMIN', 'catalog-admin');
  const created = await t.gql(
    'mutation { createNode(name: "gpu-1") { ... on CreatedNode { token } } }',
    {},
    { token: admin },
  );
  nodeToken = created.data?.createNode.token;
});
afterAll(() => t.close());

const REPORT = `mutation($i: NodeReportInput!) { reportNode(input: $i) { __typename ... on Node { name online gpus { freeMiB } engines { build } } ... on Error { message } ... on ValidationError { field } } }`;
const report = {
  gpus: [{ index: 0, name: 'RTX 4090', totalMiB: 24564, freeMiB: 20000 }],
  engines: [{ name: 'llama.cpp', version: 'b4748', build: 4748 }],
  diskFreeBytes: 10 ** 12,
  agentVersion: '0.1.0',
};

describe('node agents', () => {
  it('report their inventory with the node token; the report is audited when it changes, not at every heartbeat', async () => {
    const r = await t.gql(REPORT, { i: report }, { token: nodeToken });
    expect(r.data?.reportNode).toEqual({
      __typename: 'Node',
      name: 'gpu-1',
      online: true,
      gpus: [{ freeMiB: 20000 }],
      engines: [{ build: 4748 }],
    });
    await t.gql(REPORT, { i: { ...report, gpus: [{ ...report.gpus[0], freeMiB: 19000 }] } }, { token: nodeToken });
    const audits = await t.app.db.prisma.auditEvent.findMany({ where: { action: 'reportNode' } });
    expect(audits).toHaveLength(1);
    expect(audits[0]).toMatchObject({ actor: 'node:gpu-1', message: 'RTX 4090 24564 MiB; llama.cpp b4748' });
  });

  it('refuses a report from a user and a malformed one', async () => {
    const asUser = await t.gql(REPORT, { i: report }, { token: operator });
    expect(asUser.data?.reportNode.__typename).toBe('ForbiddenError');
    const bad = await t.gql(
      REPORT,
      { i: { ...report, gpus: [{ ...report.gpus[0], freeMiB: -1 }] } },
      { token: nodeToken },
    );
    expect(bad.data?.reportNode).toMatchObject({ __typename: 'ValidationError', field: 'input.gpus.0.freeMiB' });
  });
});

describe('serving a mirrored version', () => {
  it('plans before anything is created: engine, memory from the header, where it fits', async () => {
    const r = await t.gql(
      '{ servePlan(model: "llama-vocab", version: "v1") { __typename ... on ServePlan { name engine architecture servable verdict context memoryBytes fitsOn { node fits } source } ... on Error { message } } }',
      {},
      { token: operator },
    );
    const plan = r.data?.servePlan;
    expect(plan).toMatchObject({
      __typename: 'ServePlan',
      name: 'llama-vocab',
      engine: 'llamacpp',
      architecture: 'llama',
      servable: true,
      context: 4096,
    });
    expect(plan.verdict).toBe('llama loads in llama.cpp b1041 and later; the nodes run b4748');
    expect(plan.memoryBytes).toBe(723_869 + 2048 * 1024 ** 2 + 512 * 1024 ** 2);
    expect(plan.fitsOn).toEqual([{ node: 'gpu-1', fits: true }]);
    expect(plan.source).toBe(`${base}/mirror/llama-vocab/v1/model.gguf`);
  });

  it('puts it in the catalog, answered as placed on the next pass, and the mirror shows who uses it', async () => {
    const r = await t.gql(
      'mutation { serveMirrorVersion(model: "llama-vocab", version: "v1", name: "llama-7b") { __typename ... on ServePlaced { message model { name mode wantedReplicas engine declared } } ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(r.data?.serveMirrorVersion).toEqual({
      __typename: 'ServePlaced',
      message: 'llama-7b is in the catalog: replicas are placed on the next pass',
      model: { name: 'llama-7b', mode: 'ALWAYS', wantedReplicas: 1, engine: 'llamacpp', declared: false },
    });
    const used = await t.gql(
      '{ mirrorVersion(model: "llama-vocab", version: "v1") { usedBy { name mode } } }',
      {},
      { token: operator },
    );
    expect(used.data?.mirrorVersion.usedBy).toEqual([{ name: 'llama-7b', mode: 'ALWAYS' }]);
    const again = await t.gql(
      'mutation { serveMirrorVersion(model: "llama-vocab", version: "v1", name: "llama-7b") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(again.data?.serveMirrorVersion).toEqual({
      __typename: 'ConflictError',
      message: 'the catalog already has a model named llama-7b: choose another name',
    });
  });

  it('fails at the HEAD check when the source does not answer, and creates nothing', async () => {
    // The plan reads the header from disk; the HEAD goes to the URL nodes will use, here one nobody answers.
    t.app.services.mirror.setBaseUrl(() => 'http://127.0.0.1:9');
    const r = await t.gql(
      'mutation { serveMirrorVersion(model: "llama-vocab", version: "v2", name: "unreachable") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    t.app.services.mirror.setBaseUrl(() => base);
    expect(r.data?.serveMirrorVersion.__typename).toBe('UpstreamError');
    expect(r.data?.serveMirrorVersion.message).toMatch(
      /^the source http:\/\/127\.0\.0\.1:9\/mirror\/llama-vocab\/v2\/model\.gguf did not answer a HEAD request/,
    );
    expect(await t.app.db.prisma.catalogModel.count({ where: { name: 'unreachable' } })).toBe(0);
  });

  it('refuses a version whose file went away from disk', async () => {
    await fs.rm(path.join(t.dataDir, 'mirror/files/llama-vocab/v2/model.gguf'));
    const r = await t.gql(
      'mutation { serveMirrorVersion(model: "llama-vocab", version: "v2", name: "gone") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(r.data?.serveMirrorVersion).toEqual({
      __typename: 'ConflictError',
      message: 'llama-vocab/v2/model.gguf is listed as present but is not on disk (removed by hand?): fetch it again',
    });
  });

  it('changes the mode in place, with typed refusals', async () => {
    const SET =
      'mutation($m: ModelMode!, $r: Int) { setModelMode(name: "llama-7b", mode: $m, replicas: $r) { __typename ... on Model { mode wantedReplicas modeMessage replicas { state desired } } ... on ValidationError { field } ... on Error { message } } }';
    expect((await t.gql(SET, { m: 'ON_DEMAND' }, { token: operator })).data?.setModelMode).toMatchObject({
      __typename: 'Model',
      mode: 'ON_DEMAND',
      wantedReplicas: 1,
    });
    // Each answer is made after the placement pass it causes: it shows the replicas as that pass left them (no
    // node here, so placed ones wait), never the ones from before, which a console would keep over the live event.
    const always = (await t.gql(SET, { m: 'ALWAYS', r: 3 }, { token: operator })).data?.setModelMode;
    expect(always).toMatchObject({ __typename: 'Model', mode: 'ALWAYS', wantedReplicas: 3 });
    const running = always.replicas.filter((r: { desired: string }) => r.desired === 'RUN');
    expect(running.length).toBeGreaterThan(0);
    expect(running.filter((r: { state: string }) => r.state !== 'PENDING')).toEqual([]);
    // A pass of another replica holds the placement lock a moment: the answer still waits for this one's pass.
    let locked: () => void = () => {};
    const holding = new Promise<void>((r) => {
      locked = r;
    });
    const otherPass = t.app.db.prisma.$transaction(async (tx) => {
      await tx.$executeRaw`SELECT pg_advisory_xact_lock(${PLACEMENT_LOCK})`;
      locked();
      await new Promise((r) => setTimeout(r, 300));
    });
    await holding;
    const stopped = (await t.gql(SET, { m: 'STOPPED' }, { token: operator })).data?.setModelMode;
    await otherPass;
    expect(stopped).toMatchObject({ __typename: 'Model', mode: 'STOPPED', wantedReplicas: 0 });
    // None still waits to be placed: the pass stopped them.
    expect(stopped.modeMessage).toBe('stopped: no replica runs; set it to always or on demand to serve it');
    expect((await t.gql(SET, { m: 'ALWAYS', r: 0 }, { token: operator })).data?.setModelMode).toMatchObject({
      __typename: 'ValidationError',
      field: 'replicas',
    });
  });

  it('restricts who may call a model to an owner, shown as its name, audited; null makes it public again', async () => {
    const admin = await t.token('ADMIN', 'catalog-owner-admin');
    await t.gql('mutation { createOrg(name: "acme") { __typename } }', {}, { token: admin });
    const team = await t.gql(
      'mutation { createTeam(org: "acme", name: "research") { ... on Team { id } } }',
      {},
      {
        token: admin,
      },
    );
    const teamId = team.data?.createTeam.id as string;
    // The operator is in the team: a model given to a team it is not in would be hidden from it from then on, as
    // at /v1 (src/org/owned-metadata.test.ts), and the rest of this test changes it again.
    const ops = await t.app.db.prisma.apiToken.findFirstOrThrow({ where: { name: 'catalog-ops' } });
    const joined = await t.gql(
      'mutation($i: AddMemberInput!) { addMember(input: $i) { __typename ... on Membership { id } } }',
      { i: { org: 'acme', team: 'research', apiToken: ops.id } },
      { token: admin },
    );
    const membership = { id: joined.data?.addMember.id as string };
    const SET = `mutation($n: String!, $o: String) {
      setModelOwner(name: $n, owner: $o) {
        __typename ... on Model { name owner } ... on ValidationError { field } ... on Error { message }
      }
    }`;
    const set = await t.gql(SET, { n: 'llama-7b', o: 'team:acme/research' }, { token: operator });
    expect(set.data?.setModelOwner).toEqual({ __typename: 'Model', name: 'llama-7b', owner: 'team:acme/research' });
    const row = await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'llama-7b' } });
    expect(row.owner).toBe(`team:${teamId}`);
    const listed = await t.gql('{ models { name owner } }', {}, { token: operator });
    expect(listed.data?.models).toContainEqual({ name: 'llama-7b', owner: 'team:acme/research' });

    // The team cannot go while it owns the model: nobody but admins could call it any more.
    const del = await t.gql(
      'mutation($id: ID!) { deleteTeam(id: $id) { __typename ... on Error { message } } }',
      {
        id: teamId,
      },
      { token: admin },
    );
    expect(del.data?.deleteTeam).toEqual({
      __typename: 'ConflictError',
      message:
        'team acme/research still holds model llama-7b: delete it first (a model may instead be given another owner with setModelOwner), so nothing is left owned by a part of the tree that is gone',
    });

    expect((await t.gql(SET, { n: 'llama-7b', o: 'team:acme/nope' }, { token: operator })).data?.setModelOwner).toEqual(
      {
        __typename: 'ValidationError',
        field: 'owner',
        message: 'owner: org acme has no team nope',
      },
    );
    expect((await t.gql(SET, { n: 'llama-7b', o: 'acme' }, { token: operator })).data?.setModelOwner).toMatchObject({
      __typename: 'ValidationError',
      field: 'owner',
    });
    expect((await t.gql(SET, { n: 'no-such-model', o: null }, { token: operator })).data?.setModelOwner).toEqual({
      __typename: 'NotFoundError',
      message: 'the catalog has no model no-such-model',
    });
    const viewer = await t.token('VIEWER', 'catalog-viewer');
    expect((await t.gql(SET, { n: 'llama-7b', o: null }, { token: viewer })).data?.setModelOwner).toMatchObject({
      __typename: 'ForbiddenError',
    });
    await t.app.db.prisma.catalogModel.create({
      data: { name: 'declared-owned', source: 'http://mirror.example/m.gguf', engine: 'llamacpp', declared: true },
    });
    expect(
      (await t.gql(SET, { n: 'declared-owned', o: 'team:acme/research' }, { token: operator })).data?.setModelOwner,
    ).toEqual({
      __typename: 'ConflictError',
      message: 'declared-owned is declared in hangar.yaml: change it there; it is read at every start',
    });
    await t.app.db.prisma.catalogModel.delete({ where: { name: 'declared-owned' } });
    // Refusals changed nothing.
    expect((await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'llama-7b' } })).owner).toBe(
      `team:${teamId}`,
    );

    const cleared = await t.gql(SET, { n: 'llama-7b', o: null }, { token: operator });
    expect(cleared.data?.setModelOwner).toEqual({ __typename: 'Model', name: 'llama-7b', owner: null });
    const audits = await t.app.db.prisma.auditEvent.findMany({
      where: { action: 'setModelOwner', outcome: 'DONE' },
      orderBy: { id: 'asc' },
    });
    expect(audits.map((a) => [a.target, a.actor, a.message])).toEqual([
      ['llama-7b', 'token:catalog-ops (admin@example.com)', 'owner every caller → team:acme/research'],
      ['llama-7b', 'token:catalog-ops (admin@example.com)', 'owner team:acme/research → every caller'],
    ]);
    // Both rows name the team, so both are the team's to see (and admins'): the owner it got, the owner it had.
    expect(audits.map((a) => a.owner)).toEqual([`team:${teamId}`, `team:${teamId}`]);
    const refusedAudits = await t.app.db.prisma.auditEvent.count({
      where: { action: 'setModelOwner', outcome: 'REFUSED' },
    });
    expect(refusedAudits).toBe(5);
    await t.gql('mutation($id: ID!) { removeMember(id: $id) { __typename } }', { id: membership.id }, { token: admin });
    expect(
      (await t.gql('mutation($id: ID!) { deleteTeam(id: $id) { __typename } }', { id: teamId }, { token: admin })).data
        ?.deleteTeam.__typename,
    ).toBe('Org');
  });

  it('removes a model, after which its mirror version may go', async () => {
    const refused = await t.gql(
      'mutation { removeMirrorVersion(model: "llama-vocab", version: "v1") { __typename } }',
      {},
      { token: operator },
    );
    expect(refused.data?.removeMirrorVersion.__typename).toBe('ConflictError');
    const r = await t.gql(
      'mutation { removeModel(name: "llama-7b") { __typename ... on RemovedModel { name } } }',
      {},
      { token: operator },
    );
    expect(r.data?.removeModel).toEqual({ __typename: 'RemovedModel', name: 'llama-7b' });
    const ok = await t.gql(
      'mutation { removeMirrorVersion(model: "llama-vocab", version: "v1") { __typename } }',
      {},
      { token: operator },
    );
    expect(ok.data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
  });
});

describe('declared models (hangar.yaml)', () => {
  it('reads them at start, shows them as declared, and refuses to change them, saying where to', async () => {
    const file = path.join(t.dataDir, 'hangar.yaml');
    await fs.writeFile(
      file,
      'models:\n  - name: declared-llama\n    source: http://mirror.example/mirror/llama/v1/model.gguf\n    engine: llamacpp\n    mode: ON_DEMAND\n    parallel: 4\n',
    );
    const config = loadConfig({
      HANGAR_DATA_DIR: t.dataDir,
      HANGAR_CONFIG: file,
      HANGAR_LOG_LEVEL: 'silent',
      PORT: '0',
    });
    const app = await createApp({ config, log: createLogger('silent'), database: t.app.db, print: () => {} });
    const m = await app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'declared-llama' } });
    expect(m).toMatchObject({ declared: true, minReplicas: 0, maxReplicas: 1, parallel: 4 });
    const body = JSON.stringify({
      query: 'mutation { setModelMode(name: "declared-llama", mode: ALWAYS) { __typename ... on Error { message } } }',
    });
    const res = await app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'content-length': String(body.length),
        authorization: `Bearer ${operator}`,
      },
      body,
    });
    const r = (await res.json()) as { data?: { setModelMode: unknown } };
    expect(r.data?.setModelMode).toEqual({
      __typename: 'ConflictError',
      message: `declared-llama is declared in ${file} (models.0, name: declared-llama): change it there; it is read at every start`,
    });
    await app.stop();
  });

  it('stops the start on a bad hangar.yaml, naming the entry', async () => {
    const file = path.join(t.dataDir, 'bad.yaml');
    await fs.writeFile(file, 'models:\n  - name: ok\n    source: not a url\n    engine: llamacpp\n');
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
      `HANGAR_CONFIG=${file}: models.0.source: an http:// or https:// URL of the weights`,
    );
    await fs.writeFile(
      file,
      'models:\n  - name: ok\n    source: http://mirror.example/m.gguf\n    engine: llamacpp\n    parallel: 100\n',
    );
    const tooMany = await createApp({ config, log: createLogger('silent'), database: t.app.db, print: () => {} }).catch(
      (e: unknown) => e,
    );
    expect((tooMany as Error).message).toBe(`HANGAR_CONFIG=${file}: models.0.parallel: at most 64 requests at once`);
  });
});
