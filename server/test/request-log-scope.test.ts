import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import type { Database } from '../src/db/database.js';
import { startReportingNode } from './fixtures/reporting-node.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, freshDatabase } from './harness.js';

// The README's promise: every log line written while a request is handled carries its request id, whoever wrote
// it (the edge, a service it called, the gateway), and that id is the one answered as x-request-id and written
// on the request's audit rows. Lines of the background loops a request wakes are the loops' own, not that
// request's. Requests go over real sockets (HTTP, graphql-ws, OpenAI's own client on /v1), and the log is the
// app's real logger, its lines captured as JSON.

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
type Line = { msg: string; requestId?: string; clientRequestId?: string; [k: string]: unknown };

let database: Database;
let app: App;
let base: string;
let dataDir: string;
let adminToken: string;
let stopNode: (() => void) | undefined;
let notFound: http.Server;
const lines: Line[] = [];

/** A port nothing listens on: a replica there refuses every connection, as a crashed llama-server would. */
async function closedPort(): Promise<number> {
  const s = http.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

beforeAll(async () => {
  database = await freshDatabase();
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-request-log-'));
  const config = loadConfig({
    HANGAR_DATA_DIR: dataDir,
    HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
    HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
    HANGAR_LOG_LEVEL: 'debug',
    PORT: '0',
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
    HANGAR_FETCH_ALLOW: '127.0.0.1',
    // A model whose replicas all refuse is answered 503 after this, not after the default two minutes.
    HANGAR_GATEWAY_WAKE_SECONDS: '1',
  });
  app = await createApp({
    config,
    log: createLogger('debug', (l) => lines.push(JSON.parse(l))),
    database,
    print: () => {},
  });
  base = await app.start();
  // The setup in-process: only the requests under test go over a socket.
  const inProcess = async (query: string, headers: Record<string, string> = {}) =>
    app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({ query }),
    });
  const session = await inProcess(
    `mutation { login(email: "${ADMIN_EMAIL}", password: "${ADMIN_PASSWORD}") { ... on LoginPayload { csrfToken } } }`,
  );
  const csrf = ((await session.json()) as any).data.login.csrfToken as string;
  const cookie = session.headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  const created = await inProcess(
    'mutation { createApiToken(input: { name: "log-admin", role: ADMIN }) { ... on CreatedApiToken { secret } } }',
    { cookie, 'x-hangar-csrf': csrf },
  );
  adminToken = ((await created.json()) as any).data.createApiToken.secret;
  for (const name of ['rl-http', 'rl-ws', ...[1, 2, 3, 4, 5, 6].map((i) => `rl-at-once-${i}`)]) {
    const r = await inProcess(`mutation { createNode(name: "${name}") { __typename } }`, {
      authorization: `Bearer ${adminToken}`,
    });
    expect(await r.text()).toContain('CreatedNode');
  }
  // Two models whose one READY replica refuses connections, on a node that keeps reporting (one that does not is
  // offline, and placement would take its replicas as lost).
  const db = app.db.prisma;
  const node = await startReportingNode(db, 'gpu-1');
  stopNode = node.stop;
  for (const name of ['dead-a', 'dead-b']) {
    const model = await db.catalogModel.create({
      data: { name, source: `http://mirror.example/mirror/${name}/v1/model.gguf`, engine: 'llamacpp' },
    });
    const replica = await db.replica.create({
      data: {
        modelId: model.id,
        nodeId: node.id,
        state: 'READY',
        endpoint: `http://127.0.0.1:${await closedPort()}/v1`,
      },
    });
    await db.engineKey.create({ data: { replicaId: replica.id, key: `hgk_request-log-${name}-0123456789abcdef` } });
  }
  await app.services.gateway.routes.refresh();
  // An upstream that has no such file: the download the mirror's loop starts fails at once.
  notFound = http.createServer((_req, res) => res.writeHead(404).end('no such file'));
  await new Promise<void>((r) => notFound.listen(0, '127.0.0.1', r));
}, 120_000);

afterAll(async () => {
  stopNode?.();
  await new Promise((r) => notFound?.close(r));
  await app?.stop();
  await database?.close();
  if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
});

/** One POST /graphql over a socket, as a script sends it, with its own x-request-id. */
async function graphql(query: string, callerId: string, variables: Record<string, unknown> = {}) {
  const r = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${adminToken}`,
      'x-request-id': callerId,
    },
    body: JSON.stringify({ query, variables }),
  });
  return { id: r.headers.get('x-request-id'), body: (await r.json()) as any };
}

const removeNode = (name: string) => `mutation { removeNode(name: "${name}") { __typename ... on Error { message } } }`;
const auditRow = (action: string, target: string) =>
  database.prisma.auditEvent.findFirstOrThrow({ where: { action, target } });
const linesOf = (msg: string, where: (l: Line) => boolean = () => true) =>
  lines.filter((l) => l.msg === msg && where(l));

async function until<T>(what: string, get: () => T | undefined, ms = 20_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = get();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`${what}: not seen within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('a request id on every line of the request', () => {
  it("is on a mutation's service lines and its audit row: the id the edge answered, the caller's kept beside it", async () => {
    const { id, body } = await graphql(removeNode('rl-http'), 'script-run-7');
    expect(body.data.removeNode.__typename).toBe('RemovedNode');
    expect(id).toMatch(UUID);
    const row = await auditRow('removeNode', 'rl-http');
    expect(row.requestId).toBe(id);
    // Written by the fleet service through logFor(log, actor): the Actor the edge built carries both ids.
    const [line] = linesOf('removed a node', (l) => l.node === 'rl-http');
    expect(line).toMatchObject({ requestId: id, clientRequestId: 'script-run-7' });
  });

  // A graphql-ws operation gets an id of its own (graphql/ws.ts) that no edge saw, as does an operation run
  // in-process through Yoga: both reach the services' lines through the Actor the GraphQL context builds from it.
  // Mutations over graphql-ws are refused (POST only), so the operation here is run in-process.
  it('is on the lines of an operation no edge saw: its own id, the one on its audit row', async () => {
    const answer = await app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` },
      body: JSON.stringify({ query: removeNode('rl-ws') }),
    });
    expect(((await answer.json()) as any).data.removeNode.__typename).toBe('RemovedNode');
    const row = await auditRow('removeNode', 'rl-ws');
    expect(row.requestId).toMatch(UUID);
    const [line] = linesOf('removed a node', (l) => l.node === 'rl-ws');
    expect(line?.requestId).toBe(row.requestId);
  });

  it("is never another request's when requests run at the same time", async () => {
    const names = [1, 2, 3, 4, 5, 6].map((i) => `rl-at-once-${i}`);
    const answers = await Promise.all(names.map((name) => graphql(removeNode(name), `caller-${name}`)));
    const ids = new Set<string | null>();
    for (const [i, name] of names.entries()) {
      const answer = answers[i];
      expect(answer?.body.data.removeNode.__typename).toBe('RemovedNode');
      ids.add(answer?.id ?? null);
      const row = await auditRow('removeNode', name);
      expect(row.requestId).toBe(answer?.id);
      const found = linesOf('removed a node', (l) => l.node === name);
      expect(found).toHaveLength(1);
      expect(found[0]).toMatchObject({ requestId: answer?.id, clientRequestId: `caller-${name}` });
    }
    expect(ids.size).toBe(names.length);
  });

  it("is on the gateway's lines of a /v1 call, each call its own, two at once", async () => {
    const call = (model: string) =>
      new OpenAI({
        baseURL: `${base}/v1`,
        apiKey: adminToken,
        maxRetries: 0,
        defaultHeaders: { 'x-request-id': `app-${model}` },
      }).chat.completions
        .create({ model, messages: [{ role: 'user', content: 'hi' }] })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
    const errors = await Promise.all([call('dead-a'), call('dead-b')]);
    for (const e of errors) expect(e).toBeInstanceOf(OpenAI.APIError);
    const replicas = await database.prisma.replica.findMany({ include: { model: true } });
    for (const model of ['dead-a', 'dead-b']) {
      // /v1 answers OpenAI's headers only; the edge's own line of the call says which id it was given.
      const edge = await until(`the edge's line of ${model}`, () =>
        linesOf('request', (l) => l.route === 'gateway' && l.clientRequestId === `app-${model}`).at(0),
      );
      expect(edge.requestId).toMatch(UUID);
      const replicaId = replicas.find((r) => r.model.name === model)?.id;
      const failed = linesOf(
        'gateway: a replica failed a request; others get the next ones',
        (l) => l.replicaId === replicaId,
      );
      expect(failed.length).toBeGreaterThan(0);
      for (const l of failed) expect(l).toMatchObject({ requestId: edge.requestId, clientRequestId: `app-${model}` });
    }
  }, 60_000);

  it('is not on the lines of the download a mutation set going: those carry the loop and the file', async () => {
    const { port } = notFound.address() as AddressInfo;
    const { id, body } = await graphql(
      `mutation($s: [MirrorSourceInput!]!) {
        fetchToMirror(model: "gone", version: "v1", sources: $s, fetchAnyway: true) { __typename ... on Error { message } }
      }`,
      'fetch-run',
      { s: [{ url: `http://127.0.0.1:${port}/model.gguf` }] },
    );
    expect(body.data.fetchToMirror.__typename, JSON.stringify(body)).toBe('FetchStarted');
    const failed = await until('the failed download', () =>
      linesOf('mirror file failed', (l) => l.file === 'gone/v1/model.gguf').at(0),
    );
    const file = await database.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'gone' } });
    expect(failed).not.toHaveProperty('requestId');
    expect(failed).not.toHaveProperty('clientRequestId');
    expect(failed).toMatchObject({ loop: 'mirror', fileId: file.id });
    expect(lines.filter((l) => l.loop === 'mirror').every((l) => l.requestId === undefined)).toBe(true);
    // The request itself did carry it, on its audit row.
    expect((await auditRow('fetchToMirror', 'gone/v1')).requestId).toBe(id);
  });
});
