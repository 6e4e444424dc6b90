import { createLogger } from '@hangar/common/log';
import { waitUntil } from '@hangar/common/retry';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startReportingNode } from '../../test/fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { recordAllSql } from '../../test/sql-count.js';
import { ownerKey } from '../org/org.service.js';
import { makePubSub } from '../pubsub.js';
import { RouteTable } from './routes.js';

// The route table follows the catalog's events (routes.ts): a change made in the database reaches routing by the
// trigger's event alone, with the whole-catalog safety read set a day apart, and an idle table reads nothing. The
// changes are made as their owners make them (rows written in one statement, as an agent's report or a publishing
// job writes them; an owner set through the GraphQL mutation) against a real PostgreSQL, and the requests go
// through OpenAI's client to a stand-in replica on a real socket.

const KEY = 'hgk_routes-events-engine-key-0123456789abcdef';

let t: TestApp;
let base: string;
let token: string;
let tokenId: string;
let admin: string;
let replica: StandInReplica;
let nodeId: string;
let stopNode: (() => void) | undefined;

const db = () => t.app.db.prisma;
const routes = () => t.app.services.gateway.routes;
const client = () => new OpenAI({ baseURL: `${base}/v1`, apiKey: token, maxRetries: 0 });
/** A streamed chat (the stand-in replica streams): its status and text, or the error's status and message. */
async function chat(model: string): Promise<{ status: number; text: string }> {
  try {
    let text = '';
    const answer = await client().chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
    return { status: 200, text };
  } catch (err) {
    return { status: (err as { status?: number }).status ?? 0, text: (err as Error).message };
  }
}

/**
 * The route table's whole reads: its replicas' query (running ones, and those failed since a time) not narrowed to
 * some models. Told apart by that shape: the placement pass reads the catalog whole too, on its own clock.
 */
const readsWholeCatalog = (statements: string[]) =>
  statements.filter(
    (s) =>
      /FROM "public"\."Replica"/.test(s) && /"Replica"\."updatedAt" >/.test(s) && !/"Replica"\."modelId" IN/.test(s),
  );

/** Waits (bounded) until the table says `ok`, recording every statement meanwhile. */
async function reaches(ok: () => boolean) {
  const { result, statements } = await recordAllSql(() => waitUntil(ok, { timeoutMs: 10_000, pollMs: 5 }));
  return { reached: result, wholeReads: readsWholeCatalog(statements).length };
}

const readyReplica = (modelId: string, adapters: string[] = []) =>
  db().replica.create({
    data: {
      modelId,
      nodeId,
      state: 'READY',
      endpoint: replica.endpoint,
      adapters,
      engineKey: { create: { key: KEY } },
    },
  });

beforeAll(async () => {
  // The whole catalog is read at start and then a day later: whatever reaches routing here came by its event.
  t = await startTestApp({ HANGAR_GATEWAY_ROUTES_REREAD_SECONDS: '86400' });
  base = await t.app.start();
  admin = await t.token('ADMIN', 'routes-admin');
  token = await t.token('VIEWER', 'an-application');
  tokenId = (await db().apiToken.findFirstOrThrow({ where: { name: 'an-application' } })).id;
  replica = await startStandInReplica({ key: KEY });
  const node = await startReportingNode(db(), 'gpu-events');
  stopNode = node.stop;
  nodeId = node.id;
});

afterAll(async () => {
  stopNode?.();
  await replica?.close();
  await t?.close();
});

describe('the route table by events', () => {
  it('reads nothing while nothing changes', async () => {
    // Two of the old one-second re-reads would fall in this window.
    const { statements } = await recordAllSql(() => new Promise((r) => setTimeout(r, 2500)));
    expect(statements.filter((s) => /"CatalogModel"|"Replica"/.test(s) && /FROM/.test(s))).toEqual([]);
  });

  it('routes a new model with a READY replica as soon as its event comes, reading only that model', async () => {
    const model = await db().catalogModel.create({
      data: { name: 'evented', source: 'http://mirror.example/mirror/evented/v1/model.gguf', engine: 'llamacpp' },
    });
    await readyReplica(model.id);
    const seen = await reaches(
      () =>
        routes()
          .lookup('evented')
          ?.model.replicas.some((r) => r.state === 'READY' && r.engineKey) ?? false,
    );
    expect(seen).toEqual({ reached: true, wholeReads: 0 });
    expect(await chat('evented')).toEqual({ status: 200, text: replica.words.join('') });
  });

  it('routes to a replica that turned READY, and to an adapter once it is published', async () => {
    const model = await db().catalogModel.create({
      data: { name: 'loading', source: 'http://mirror.example/mirror/loading/v1/model.gguf', engine: 'llamacpp' },
    });
    const r = await db().replica.create({ data: { modelId: model.id, nodeId, state: 'LOADING' } });
    expect(
      await reaches(
        () =>
          routes()
            .lookup('loading')
            ?.model.replicas.some((x) => x.state === 'LOADING') ?? false,
      ),
    ).toEqual({ reached: true, wholeReads: 0 });

    // The agent's report: the endpoint, its key and READY, in one transaction (fleet-replicas.ts writes them so).
    await db().$transaction([
      db().replica.update({
        where: { id: r.id },
        data: { state: 'READY', endpoint: replica.endpoint, adapters: ['loading-lora'] },
      }),
      db().engineKey.create({ data: { replicaId: r.id, key: KEY } }),
    ]);
    expect(
      await reaches(
        () =>
          routes()
            .lookup('loading')
            ?.model.replicas.some((x) => x.state === 'READY') ?? false,
      ),
    ).toEqual({ reached: true, wholeReads: 0 });
    expect((await chat('loading')).status).toBe(200);

    // A publishing job's adapter row: the name is routable (to the replica holding it) by its event.
    expect((await chat('loading-lora')).status).toBe(404);
    await db().adapter.create({
      data: { name: 'loading-lora', source: 'http://mirror.example/a.gguf', modelId: model.id, artifactSha256: 'x' },
    });
    expect(await reaches(() => routes().lookup('loading-lora')?.adapter !== undefined)).toEqual({
      reached: true,
      wholeReads: 0,
    });
    const answered = await chat('loading-lora');
    expect(answered.status).toBe(200);
    expect(replica.requests.at(-1)?.body.lora).toEqual([{ id: 0, scale: 1 }]);
  });

  it('applies an owner set through setModelOwner, and an adapter given to another owner, by their events', async () => {
    const model = await db().catalogModel.create({
      data: { name: 'owned', source: 'http://mirror.example/mirror/owned/v1/model.gguf', engine: 'llamacpp' },
    });
    await readyReplica(model.id, ['owned-lora']);
    await db().adapter.create({
      data: { name: 'owned-lora', source: 'http://mirror.example/b.gguf', modelId: model.id, artifactSha256: 'y' },
    });
    expect(await reaches(() => routes().lookup('owned-lora')?.adapter !== undefined)).toEqual({
      reached: true,
      wholeReads: 0,
    });
    expect((await chat('owned-lora')).status).toBe(200);

    // The adapter given to another key (this one's id with its last digit changed, never to itself): this caller
    // may no longer call it, as if it did not exist.
    const otherKey = ownerKey({ scope: 'key', id: `${tokenId.slice(0, -1)}${tokenId.endsWith('0') ? '1' : '0'}` });
    await db().adapter.update({ where: { name: 'owned-lora' }, data: { owner: otherKey } });
    expect(await reaches(() => routes().lookup('owned-lora')?.adapter?.owner === otherKey)).toEqual({
      reached: true,
      wholeReads: 0,
    });
    expect(await chat('owned-lora')).toMatchObject({ status: 404 });

    // The model given to a team the caller is not in, by the operator's mutation.
    const gql = async (query: string) => (await t.gql(query, {}, { token: admin })).data ?? {};
    await gql('mutation { createOrg(name: "elsewhere") { __typename } }');
    await gql('mutation { createTeam(org: "elsewhere", name: "them") { __typename } }');
    expect((await chat('owned')).status).toBe(200);
    const set = await gql(
      'mutation { setModelOwner(name: "owned", owner: "team:elsewhere/them") { __typename ... on Error { message } } }',
    );
    expect(set.setModelOwner).toEqual({ __typename: 'Model' });
    expect(await reaches(() => routes().lookup('owned')?.model.owner !== null)).toEqual({
      reached: true,
      wholeReads: 0,
    });
    expect(await chat('owned')).toMatchObject({ status: 404 });
  });

  it('forgets a removed model by its event', async () => {
    await db().catalogModel.delete({ where: { name: 'evented' } });
    expect(await reaches(() => routes().lookup('evented') === undefined)).toEqual({ reached: true, wholeReads: 0 });
    expect(await chat('evented')).toMatchObject({ status: 404 });
  });

  it('reads the whole catalog again when its events come back after a break (what was said meanwhile went unheard)', async () => {
    // A second table on the same database, whose events never come (a pubsub nobody publishes on): as a process
    // whose LISTEN connection was down while the catalog changed.
    let since: number | undefined = Date.now();
    const table = new RouteTable({
      db: t.app.db.prisma,
      log: createLogger('silent'),
      events: { pubsub: makePubSub(), listeningSince: () => since },
      rereadMs: 86_400_000,
    });
    await table.start();
    try {
      const model = await db().catalogModel.create({
        data: { name: 'unheard', source: 'http://mirror.example/mirror/unheard/v1/model.gguf', engine: 'llamacpp' },
      });
      await readyReplica(model.id);
      // Its connection is back: a new since. The next look (once a second) reads everything.
      since = Date.now() + 1;
      expect(
        await waitUntil(() => table.lookup('unheard')?.model.replicas.length === 1, { timeoutMs: 10_000, pollMs: 20 }),
      ).toBe(true);
    } finally {
      table.stop();
    }
  });

  it('keeps reading after a read asked for with nothing left to read (a burst taken by the read before it)', async () => {
    const table = new RouteTable({
      db: t.app.db.prisma,
      log: createLogger('silent'),
      events: { pubsub: makePubSub(), listeningSince: () => Date.now() },
      rereadMs: 86_400_000,
    });
    await table.start();
    const bounded = (p: Promise<void>) =>
      Promise.race([p.then(() => 'read'), new Promise((r) => setTimeout(() => r('stuck'), 10_000))]);
    try {
      // As a burst's timer firing after the read under way took its models: nothing is left to read.
      expect(await bounded(table.refreshModels([]))).toBe('read');
      await db().catalogModel.create({
        data: { name: 'after-empty', source: 'http://mirror.example/mirror/x/v1/model.gguf', engine: 'llamacpp' },
      });
      expect(await bounded(table.refresh())).toBe('read');
      expect(table.lookup('after-empty')).toBeDefined();
    } finally {
      table.stop();
    }
  });
});
