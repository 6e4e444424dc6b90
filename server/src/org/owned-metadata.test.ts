import { type Client, createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { notify } from '../pubsub.js';

// An owned adapter is hidden from everyone its owner does not admit at /v1 and /mirror; GraphQL must not show it
// either: not its name, owner, source, sha256 or training job, in any list, lookup, subscription or audit row.
// Tried as an operator of another team and as a plain viewer; a team member (by token and by session) and an
// admin still see it all. The owner is team acme/secret.

let t: TestApp;
let base: string;
let wsUrl: string;
const who: Record<'memberViewer' | 'outsideOperator' | 'plainViewer' | 'admin', string> = {} as never;
let memberSession: { cookie: string; csrf: string };
let secretJobId: string;
let publicJobId: string;
let secretVersion: string;
const SECRET_SHA = 'a'.repeat(64);
const clients: Client[] = [];

beforeAll(async () => {
  t = await startTestApp();
  base = await t.app.start();
  wsUrl = `${base.replace('http', 'ws')}/graphql`;
  const p = t.app.db.prisma;

  const org = await p.org.create({ data: { name: 'acme' } });
  const secret = await p.team.create({ data: { orgId: org.id, name: 'secret' } });
  const sales = await p.team.create({ data: { orgId: org.id, name: 'sales' } });
  // Tokens are principals of their own: each is made a member (or not) by itself.
  const member = async (role: 'OPERATOR' | 'VIEWER' | 'ADMIN', name: string, teamId: string | null) => {
    const token = await t.token(role, name);
    const row = await p.apiToken.findFirstOrThrow({ where: { name } });
    if (teamId) await p.membership.create({ data: { orgId: org.id, teamId, apiTokenId: row.id } });
    return token;
  };
  who.memberViewer = await member('VIEWER', 'secret-viewer', secret.id);
  who.outsideOperator = await member('OPERATOR', 'sales-operator', sales.id);
  who.plainViewer = await member('VIEWER', 'plain-viewer', null);
  who.admin = await member('ADMIN', 'meta-admin', null);

  const created = await t.gql(
    'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename ... on User { id } ... on Error { message } } }',
    { i: { email: 'ana@acme.example', name: 'Ana', role: 'VIEWER', password: 'a-long-enough-password' } },
    { token: who.admin },
  );
  await p.membership.create({ data: { orgId: org.id, teamId: secret.id, userId: created.data?.createUser.id } });
  memberSession = await t.login('ana@acme.example', 'a-long-enough-password');

  const job = (name: string, owner: string | null) =>
    p.trainJob.create({
      data: {
        name,
        model: 'base',
        baseRepo: 'hangar-test/tiny-llama',
        gpuMiB: 1000,
        owner,
        dataPath: '/nonexistent/pairs.ndjson',
        dataSha256: 'b'.repeat(64),
        dataBytes: 10,
        pairs: 1,
      },
    });
  const secretJob = await job('secret-lora', `team:${secret.id}`);
  const publicJob = await job('open-lora', null);
  secretJobId = secretJob.id;
  publicJobId = publicJob.id;
  secretVersion = `job-${secretJob.id.slice(0, 8)}`;

  const file = (model: string, version: string, name: string, sha: string) =>
    p.mirrorFile.create({
      data: {
        model,
        version,
        file: name,
        sourceUrl: `https://hub.example/${model}/${name}`,
        state: 'PRESENT',
        bytesDone: 10n,
        bytesTotal: 10n,
        expectedSha256: sha,
        actualSha256: sha,
      },
    });
  await file('base', 'v1', 'model.gguf', 'c'.repeat(64));
  await file('secret-lora', secretVersion, 'adapter.gguf', SECRET_SHA);
  const model = await p.catalogModel.create({
    data: { name: 'base', source: `${base}/mirror/base/v1/model.gguf`, engine: 'llamacpp', minReplicas: 0 },
  });
  await p.adapter.create({
    data: {
      name: 'secret-lora',
      source: `${base}/mirror/secret-lora/${secretVersion}/adapter.gguf`,
      owner: `team:${secret.id}`,
      modelId: model.id,
      trainJobId: secretJob.id,
      artifactSha256: SECRET_SHA,
    },
  });
  await p.adapter.create({
    data: { name: 'open-lora', source: `${base}/mirror/base/v1/open.gguf`, modelId: model.id },
  });
  await p.replica.create({ data: { modelId: model.id, adapters: ['secret-lora', 'open-lora'], desired: 'STOP' } });
  // An owned model: hidden at /v1 from those its owner does not admit, and so here.
  await p.catalogModel.create({
    data: {
      name: 'secret-base',
      source: `${base}/mirror/base/v1/model.gguf`,
      engine: 'llamacpp',
      owner: `team:${secret.id}`,
    },
  });

  // Audit rows about the owned things, written by the real mutations.
  const cancelled = await t.gql(
    'mutation($id: ID!) { cancelTrainJob(id: $id) { __typename ... on Error { message } } }',
    { id: secretJobId },
    { token: who.admin },
  );
  expect(cancelled.data?.cancelTrainJob.__typename).toBe('TrainJob');
  const moded = await t.gql(
    'mutation { setModelMode(name: "secret-base", mode: STOPPED) { __typename ... on Error { message } } }',
    {},
    { token: who.admin },
  );
  expect(moded.data?.setModelMode.__typename).toBe('Model');
}, 120_000);
afterAll(async () => {
  await Promise.all(clients.map((c) => c.dispose()));
  await t?.close();
});

const as = (name: keyof typeof who | 'memberSession') =>
  name === 'memberSession' ? memberSession : { token: who[name] };

/** Everything a GraphQL caller can read about the catalog, training, the mirror and the audit log, as one text. */
async function everything(name: keyof typeof who | 'memberSession') {
  const q = `query($id: ID!, $v: String!) {
    models { name owner adapters { name source owner trainJobId artifactSha256 } replicas { adapters } }
    base: model(name: "base") { adapters { name } }
    secretBase: model(name: "secret-base") { name }
    trainJobs { edges { node { id name owner dataSha256 adapter } } }
    trainJob(id: $id) { id name }
    mirror { present fetching failed diskUsedBytes
      families { name modelCount bytes versions { id usedBy { name } files { sha256 sourceUrl } } }
      versions { id } }
    mirrorVersion(model: "secret-lora", version: $v) { id files { sha256 } }
    baseVersion: mirrorVersion(model: "base", version: "v1") { usedBy { name } }
    auditEvents(first: 200) { edges { node { action target message } } }
  }`;
  const r = await t.gql(q, { id: secretJobId, v: secretVersion }, as(name));
  expect(r.errors).toBeUndefined();
  return r.data as Record<string, any>;
}

describe('GraphQL shows an owned adapter only to those its owner admits', () => {
  for (const outsider of ['outsideOperator', 'plainViewer'] as const) {
    it(`hides it from ${outsider === 'outsideOperator' ? 'an operator of another team' : 'a viewer'}`, async () => {
      const d = await everything(outsider);
      const text = JSON.stringify(d);
      expect(text).not.toContain('secret-lora');
      expect(text).not.toContain('secret-base');
      expect(text).not.toContain(SECRET_SHA);
      expect(text).not.toContain(secretVersion);
      expect(d.trainJob).toBeNull();
      expect(d.secretBase).toBeNull();
      expect(d.mirrorVersion).toBeNull();
      // Counts and totals do not count it either: one version present, 10 bytes on the disk.
      expect(d.mirror.present).toBe(1);
      expect(d.mirror.diskUsedBytes).toBe(10);
      expect(d.base.adapters).toEqual([{ name: 'open-lora' }]);
      expect(d.trainJobs.edges.map((e: any) => e.node.name)).toEqual(['open-lora']);
    });
  }

  for (const insider of ['memberViewer', 'memberSession', 'admin'] as const) {
    it(`still shows it to ${insider}`, async () => {
      const d = await everything(insider);
      expect(d.models.map((m: any) => m.name)).toEqual(['base', 'secret-base']);
      const base = d.models.find((m: any) => m.name === 'base');
      expect(base.adapters.map((a: any) => a.name).sort()).toEqual(['open-lora', 'secret-lora']);
      expect(base.adapters.find((a: any) => a.name === 'secret-lora').artifactSha256).toBe(SECRET_SHA);
      expect(base.replicas[0].adapters).toEqual(['secret-lora', 'open-lora']);
      expect(d.secretBase).toEqual({ name: 'secret-base' });
      expect(d.trainJob).toEqual({ id: secretJobId, name: 'secret-lora' });
      expect(d.trainJobs.edges.map((e: any) => e.node.name).sort()).toEqual(['open-lora', 'secret-lora']);
      expect(d.mirrorVersion.files).toEqual([{ sha256: SECRET_SHA }]);
      expect(d.mirror.present).toBe(2);
      expect(d.mirror.versions.map((v: any) => v.id)).toContain(`secret-lora/${secretVersion}`);
      expect(d.baseVersion.usedBy.map((u: any) => u.name).sort()).toEqual(['base', 'open-lora', 'secret-base']);
      const audit = d.auditEvents.edges.map((e: any) => `${e.node.action} ${e.node.target}`);
      expect(audit).toEqual(expect.arrayContaining(['cancelTrainJob secret-lora', 'setModelMode secret-base']));
    });
  }

  it('lets an outsider filter the audit log for it and find nothing', async () => {
    for (const outsider of ['outsideOperator', 'plainViewer'] as const) {
      for (const target of ['secret-lora', 'secret-base']) {
        const r = await t.gql(
          'query($t: String!) { auditEvents(filter: { target: $t }) { edges { node { target } } } }',
          { t: target },
          as(outsider),
        );
        expect(r.data?.auditEvents.edges).toEqual([]);
      }
    }
  });
});

describe('changing an owned thing one may not see reads as changing one that does not exist', () => {
  const ERR = '__typename ... on Error { message }';
  it("an operator of another team cannot stop the team's model, nor learn that it exists", async () => {
    const mode = (name: string) =>
      t.gql(
        `mutation($n: String!) { setModelMode(name: $n, mode: STOPPED) { ${ERR} } }`,
        { n: name },
        as('outsideOperator'),
      );
    const hidden = (await mode('secret-base')).data?.setModelMode;
    const none = (await mode('made-up-model')).data?.setModelMode;
    expect(hidden).toEqual({
      __typename: 'NotFoundError',
      message: none.message.replace('made-up-model', 'secret-base'),
    });
    const owner = await t.gql(
      `mutation { setModelOwner(name: "secret-base", owner: null) { ${ERR} } }`,
      {},
      as('outsideOperator'),
    );
    expect(owner.data?.setModelOwner.__typename).toBe('NotFoundError');
    expect(
      (await t.app.db.prisma.catalogModel.findUniqueOrThrow({ where: { name: 'secret-base' } })).owner,
    ).not.toBeNull();
  });

  it("an operator of another team cannot cancel, delete or publish the team's job", async () => {
    for (const op of ['cancelTrainJob', 'deleteTrainJob', 'publishTrainJob']) {
      const r = await t.gql(
        `mutation($id: ID!) { ${op}(id: $id) { ${ERR} } }`,
        { id: secretJobId },
        as('outsideOperator'),
      );
      expect(r.data?.[op]).toEqual({ __typename: 'NotFoundError', message: `no training job ${secretJobId}` });
    }
    expect(await t.app.db.prisma.trainJob.findUnique({ where: { id: secretJobId } })).not.toBeNull();
  });

  it("an operator of another team cannot pause or remove the team's adapter in the mirror", async () => {
    for (const op of ['cancelMirrorFetch', 'pauseMirrorFetch', 'removeMirrorVersion']) {
      const r = (version: string) =>
        t.gql(
          `mutation($v: String!) { ${op}(model: "secret-lora", version: $v) { ${ERR} } }`,
          { v: version },
          as('outsideOperator'),
        );
      const none = (await r('job-00000000')).data?.[op];
      expect((await r(secretVersion)).data?.[op]).toEqual({
        __typename: 'NotFoundError',
        message: none.message.replace('job-00000000', secretVersion),
      });
    }
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'secret-lora', state: 'PRESENT' } })).toBe(1);
  });
});

describe('subscriptions', () => {
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

  /** Every id a subscription sends, in order, and its errors. */
  function listen(client: Client, query: string, idOf: (data: any) => string) {
    const heard = { ids: [] as string[], errors: [] as string[] };
    client.subscribe(
      { query },
      {
        next: (v) => {
          if (v.errors?.length) heard.errors.push(String(v.errors[0]?.message));
          else heard.ids.push(idOf(v.data));
        },
        error: (e) => heard.errors.push(String((e as Error)?.message ?? e)),
        complete: () => {},
      },
    );
    return heard;
  }

  async function until(what: string, ok: () => boolean, tries = 1000) {
    for (let i = 0; i < tries; i++) {
      if (ok()) return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`still waiting: ${what}`);
  }

  /**
   * Once every listener is in place (it has heard a public event), sends the owned thing's event and then a public
   * one, and waits until every listener has heard that public one: a subscription's events arrive in order, so one
   * that heard the second public event and not the owned one was never sent it (no waiting on a clock).
   */
  async function sendBoth(send: (secret: boolean) => Promise<void>, listeners: { ids: string[] }[], open: string) {
    const heardOpen = (l: { ids: string[] }) => l.ids.filter((id) => id.startsWith(open)).length;
    for (let i = 0; ; i++) {
      if (i === 50) throw new Error('the subscriptions never heard the public event');
      await send(false);
      try {
        await until('every listener hears the public event', () => listeners.every((l) => heardOpen(l) > 0), 30);
        break;
      } catch {}
    }
    const before = listeners.map(heardOpen);
    await send(true);
    await send(false);
    await until('every listener hears the second public event', () =>
      listeners.every((l, k) => heardOpen(l) > (before[k] as number)),
    );
  }

  it("trainJobChanged sends an owned job's changes only to those its owner admits", async () => {
    const Q = 'subscription { trainJobChanged { id name owner } }';
    const outsider = listen(connect(who.outsideOperator), Q, (d) => d.trainJobChanged.id);
    const viewer = listen(connect(who.plainViewer), Q, (d) => d.trainJobChanged.id);
    const member = listen(connect(who.memberViewer), Q, (d) => d.trainJobChanged.id);
    const admin = listen(connect(who.admin), Q, (d) => d.trainJobChanged.id);
    await sendBoth(
      (secret) => notify(t.app.db.prisma, 'trainJob', secret ? secretJobId : publicJobId),
      [outsider, viewer, member, admin],
      publicJobId,
    );
    for (const l of [outsider, viewer, member, admin]) expect(l.errors).toEqual([]);
    expect(outsider.ids).not.toContain(secretJobId);
    expect(viewer.ids).not.toContain(secretJobId);
    expect(member.ids).toContain(secretJobId);
    expect(admin.ids).toContain(secretJobId);
  });

  it("mirrorChanged sends an owned adapter's version only to those its owner admits", async () => {
    const Q = 'subscription { mirrorChanged { id files { sha256 } usedBy { name } } }';
    const secretKey = `secret-lora/${secretVersion}`;
    // Each id with the names it was said to be used by: base/v1 is the owned model secret-base's source too.
    const heard = (d: any) => `${d.mirrorChanged.id} ${d.mirrorChanged.usedBy.map((u: any) => u.name).join(',')}`;
    const outsider = listen(connect(who.outsideOperator), Q, heard);
    // The plain viewer's and the member's tokens are one user's, with the same role: an event's result made for
    // one must not be handed to the other (graphql/shared-results.ts), as each sees different uses.
    const viewer = listen(connect(who.plainViewer), Q, heard);
    const member = listen(connect(who.memberViewer), Q, heard);
    await sendBoth(
      (secret) => notify(t.app.db.prisma, 'mirrorVersion', secret ? secretKey : 'base/v1'),
      [outsider, viewer, member],
      'base/v1 ',
    );
    for (const l of [outsider, viewer, member]) expect(l.errors).toEqual([]);
    for (const l of [outsider, viewer]) {
      expect(l.ids.join(' ')).not.toContain('secret');
      expect(l.ids).toContain('base/v1 base,open-lora');
    }
    expect(member.ids).toContain(`${secretKey} secret-lora`);
    expect(member.ids).toContain('base/v1 base,secret-base,open-lora');
  });
});

describe('side doors answer for an owned name exactly as for one that does not exist', () => {
  const outsiders = ['outsideOperator', 'plainViewer'] as const;
  const insiders = ['memberViewer', 'admin'] as const;

  it('servePlan of an owned adapter version', async () => {
    const plan = (version: string, name: keyof typeof who) =>
      t.gql(
        `query($v: String!) { servePlan(model: "secret-lora", version: $v) {
          __typename ... on Error { message } ... on ServePlan { name } } }`,
        { v: version },
        as(name),
      );
    for (const outsider of outsiders) {
      const none = (await plan('job-00000000', outsider)).data?.servePlan;
      expect(none.__typename).toBe('NotFoundError');
      expect((await plan(secretVersion, outsider)).data?.servePlan).toEqual({
        ...none,
        message: none.message.replace('job-00000000', secretVersion),
      });
    }
    // serveMirrorVersion plans first: the same answer, and nothing enters the catalog.
    const serve = (version: string) =>
      t.gql(
        `mutation($v: String!) { serveMirrorVersion(model: "secret-lora", version: $v, name: "fresh-name") {
          __typename ... on Error { message } } }`,
        { v: version },
        as('outsideOperator'),
      );
    const none = (await serve('job-00000000')).data?.serveMirrorVersion;
    expect(none.__typename).toBe('NotFoundError');
    expect((await serve(secretVersion)).data?.serveMirrorVersion).toEqual({
      ...none,
      message: none.message.replace('job-00000000', secretVersion),
    });
    // Those the owner admits get the mirror's real answer about it (here: it is an adapter, or not on disk).
    for (const insider of insiders) {
      expect((await plan(secretVersion, insider)).data?.servePlan.__typename).not.toBe('NotFoundError');
    }
  });

  it('checkTrainData with an owned model', async () => {
    const check = (model: string, name: keyof typeof who) =>
      t.gql(
        'query($m: String!) { checkTrainData(data: "{\\"q\\":\\"hi\\",\\"a\\":\\"there\\"}", model: $m) { tokensNote } }',
        { m: model },
        as(name),
      );
    for (const outsider of outsiders) {
      const none = (await check('made-up-model', outsider)).data?.checkTrainData.tokensNote as string;
      expect(none).toContain('made-up-model');
      expect((await check('secret-base', outsider)).data?.checkTrainData.tokensNote).toBe(
        none.replace('made-up-model', 'secret-base'),
      );
    }
    for (const insider of insiders) {
      const note = (await check('secret-base', insider)).data?.checkTrainData.tokensNote;
      expect(note).not.toContain('not in the catalog');
    }
  });

  it('createTrainJob for an owned model', async () => {
    const create = (model: string) =>
      t.gql(
        `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) {
          __typename ... on ValidationError { field message } } }`,
        { i: { name: 'squat-lora', model, baseRepo: 'hangar-test/tiny-llama', node: 'no-such-node', gpuMiB: 1000 } },
        as('outsideOperator'),
      );
    const none = (await create('made-up-model')).data?.createTrainJob;
    expect(none.field).toBe('model');
    expect((await create('secret-base')).data?.createTrainJob).toEqual({
      ...none,
      message: none.message.replace('made-up-model', 'secret-base'),
    });
  });

  it('usage of an owned adapter or model', async () => {
    const p = t.app.db.prisma;
    const minute = new Date(Math.floor(Date.now() / 60_000) * 60_000 - 10 * 60_000);
    // A row per token (all four are one user's, so the viewers read every row as their own; operators read all).
    for (const name of ['sales-operator', 'plain-viewer', 'secret-viewer', 'meta-admin']) {
      const token = await p.apiToken.findFirstOrThrow({ where: { name } });
      await p.usageMinute.create({
        data: { minute, tokenId: token.id, model: 'base', adapter: 'secret-lora', requests: 3 },
      });
      await p.usageMinute.create({ data: { minute, tokenId: token.id, model: 'secret-base', requests: 5 } });
    }
    const usage = (filter: string, name: keyof typeof who) =>
      t.gql(
        `query($from: DateTime!, $to: DateTime!) { usage(${filter} from: $from, to: $to, step: 60) {
          __typename ... on Usage { totals { requests } } } }`,
        {
          from: new Date(minute.getTime() - 30 * 60_000).toISOString(),
          to: new Date(minute.getTime() + 30 * 60_000).toISOString(),
        },
        as(name),
      );
    const requests = async (filter: string, name: keyof typeof who) =>
      (await usage(filter, name)).data?.usage.totals.requests;
    for (const outsider of outsiders) {
      expect(await requests('adapter: "secret-lora",', outsider)).toBe(0);
      expect(await requests('model: "secret-base",', outsider)).toBe(0);
      expect(await requests('', outsider)).toBe(0);
    }
    expect(await requests('adapter: "secret-lora",', 'memberViewer')).toBe(12);
    expect(await requests('model: "secret-base",', 'memberViewer')).toBe(20);
    expect(await requests('adapter: "secret-lora",', 'admin')).toBe(12);
    expect(await requests('model: "secret-base",', 'admin')).toBe(20);
  });
});

describe('removeMirrorVersion names only the uses the caller may see', () => {
  const REMOVE = `mutation($m: String!, $v: String!) { removeMirrorVersion(model: $m, version: $v) {
    __typename ... on Error { message } ... on RemovedMirrorVersion { files } } }`;

  it('refuses a version with visible uses by naming those alone; an admin is told of all', async () => {
    for (const outsider of ['outsideOperator'] as const) {
      const r = await t.gql(REMOVE, { m: 'base', v: 'v1' }, as(outsider));
      expect(r.data?.removeMirrorVersion.__typename).toBe('ConflictError');
      expect(r.data?.removeMirrorVersion.message).toContain('base/v1 is the source of base, open-lora');
      expect(r.data?.removeMirrorVersion.message).not.toContain('secret');
    }
    const admin = await t.gql(REMOVE, { m: 'base', v: 'v1' }, as('admin'));
    expect(admin.data?.removeMirrorVersion.message).toContain('secret-base');
  });

  it('removes a version used only by what the caller may not see as one used by nothing, and tells the owner', async () => {
    const p = t.app.db.prisma;
    const team = await p.team.findFirstOrThrow({ where: { name: 'secret' } });
    for (const model of ['unused-src', 'hidden-src']) {
      await p.mirrorFile.create({
        data: { model, version: 'v1', file: 'model.gguf', sourceUrl: `https://hub.example/${model}`, state: 'PRESENT' },
      });
    }
    await p.catalogModel.create({
      data: {
        name: 'secret-two',
        source: `${base}/mirror/hidden-src/v1/model.gguf`,
        engine: 'llamacpp',
        owner: `team:${team.id}`,
        minReplicas: 0,
      },
    });
    const unused = await t.gql(REMOVE, { m: 'unused-src', v: 'v1' }, as('outsideOperator'));
    const hidden = await t.gql(REMOVE, { m: 'hidden-src', v: 'v1' }, as('outsideOperator'));
    expect(hidden.data?.removeMirrorVersion).toEqual(unused.data?.removeMirrorVersion);
    expect(unused.data?.removeMirrorVersion).toEqual({ __typename: 'RemovedMirrorVersion', files: 1 });
    const rows = (name: keyof typeof who) =>
      t.gql(
        'query { auditEvents(filter: { target: "hidden-src" }) { edges { node { outcome message } } } }',
        {},
        as(name),
      );
    const seenBy = async (name: keyof typeof who) => JSON.stringify((await rows(name)).data?.auditEvents.edges);
    expect(await seenBy('outsideOperator')).not.toContain('secret-two');
    expect(await seenBy('plainViewer')).not.toContain('secret-two');
    expect(await seenBy('memberViewer')).toContain('secret-two');
    expect(await seenBy('admin')).toContain('secret-two');
  });
});

describe('refusals about an owned thing', () => {
  const audit = (filter: string, name: keyof typeof who) =>
    t
      .gql(
        `query { auditEvents(filter: { ${filter} }) { edges { node { actor action target outcome message } } } }`,
        {},
        as(name),
      )
      .then((r) => r.data?.auditEvents.edges.map((e: any) => e.node) as Record<string, string>[]);

  it("are filed under its owner when the caller may see it: a member's refusal is not shown to outsiders", async () => {
    const r = await t.gql(
      'mutation { setModelMode(name: "secret-base", mode: ALWAYS) { __typename } }',
      {},
      as('memberViewer'),
    );
    expect(r.data?.setModelMode.__typename).toBe('ForbiddenError');
    const mine = 'target: "secret-base", actor: "secret-viewer", outcome: REFUSED';
    for (const outsider of ['outsideOperator', 'plainViewer'] as const) expect(await audit(mine, outsider)).toEqual([]);
    for (const insider of ['memberViewer', 'admin'] as const) expect(await audit(mine, insider)).toHaveLength(1);
  });

  it("an outsider's own refusal reads as one about a name that does not exist, for it and everyone", async () => {
    for (const name of ['secret-base', 'made-up-model']) {
      await t.gql(`mutation { wakeModel(name: "${name}") { __typename } }`, {}, as('outsideOperator'));
    }
    const rows = await audit('action: "wakeModel", actor: "sales-operator"', 'outsideOperator');
    const byTarget = (target: string) => rows.find((row) => row.target === target) as Record<string, string>;
    expect(byTarget('secret-base')).toEqual({
      ...byTarget('made-up-model'),
      target: 'secret-base',
      message: byTarget('made-up-model').message?.replace('made-up-model', 'secret-base'),
    });
    expect(await audit('action: "wakeModel", actor: "sales-operator"', 'plainViewer')).toHaveLength(2);
  });

  it('fetchToMirror into an owned version is refused to an outsider as a taken name, without naming the owner', async () => {
    const fetchInto = (name: keyof typeof who) =>
      t.gql(
        `mutation($v: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: "secret-lora", version: $v, sources: $s,
          fetchAnyway: true) { __typename ... on Error { message } } }`,
        { v: secretVersion, s: [{ url: `${base}/mirror/base/v1/extra.gguf` }] },
        as(name),
      );
    const r = (await fetchInto('outsideOperator')).data?.fetchToMirror;
    expect(r).toEqual({
      __typename: 'ConflictError',
      message: `the version secret-lora/${secretVersion} is taken: choose another version name`,
    });
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'secret-lora' } })).toBe(1);
    // The refusal says the version exists to the one who asked, and to nobody else.
    const refusal = 'action: "fetchToMirror", actor: "sales-operator"';
    expect(await audit(refusal, 'plainViewer')).toEqual([]);
    expect(await audit(refusal, 'memberViewer')).toHaveLength(1);
  });

  it('an upload into an owned version is refused to an outsider the same way, and adds nothing', async () => {
    const put = (name: keyof typeof who) =>
      fetch(`${base}/mirror/secret-lora/${secretVersion}/planted.gguf`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${who[name]}` },
        body: 'planted bytes',
      });
    const res = await put('outsideOperator');
    expect(res.status).toBe(409);
    expect(JSON.stringify(await res.json())).toContain(
      `the version secret-lora/${secretVersion} is taken: choose another version name`,
    );
    expect(await t.app.db.prisma.mirrorFile.count({ where: { model: 'secret-lora', file: 'planted.gguf' } })).toBe(0);
    const refusal = 'action: "uploadToMirror", actor: "sales-operator"';
    expect(await audit(refusal, 'plainViewer')).toEqual([]);
    expect(await audit(refusal, 'memberViewer')).toHaveLength(1);
  });
});
