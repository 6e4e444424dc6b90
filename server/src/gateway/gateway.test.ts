import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { freePort } from '@hangar/common/free-port';
import { OpenAI } from '@hangar/common/test/fixtures/openai-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startReportingNode } from '../../test/fixtures/reporting-node.js';
import { type StandInReplica, startStandInReplica } from '../../test/fixtures/stand-in-replica.js';
import { startTestApp, type TestApp } from '../../test/harness.js';

// The gateway's protocol edges, against stand-in replicas on real sockets (they stand for a node's endpoint: the
// fixed words make the answers easy to check): who may call, OpenAI's refusals, a replica that cannot be reached
// or fails before its first byte, the usage chunk a client did not ask for, and usage accounted in batches.
// The real agent and llama.cpp behind the gateway are in test/gateway.test.ts.

const KEY = 'hgk_gateway-test-engine-key-0123456789abcdef';

let t: TestApp;
let base: string;
let token: string;
let replica: StandInReplica;
let nodeId: string;
let stopNode: (() => void) | undefined;

async function addModel(name: string, endpoints: string[], extra: Record<string, unknown> = {}) {
  // The model wants the replicas it is given, and comes with them in one transaction: its event sets off a
  // placement pass at once (fleet/placement-schedule.ts), which must not find it without them, or with more than
  // it wants, and add or stop one.
  const { model, replicas } = await t.app.db.prisma.$transaction(async (db) => {
    const n = Math.max(1, endpoints.length);
    const model = await db.catalogModel.create({
      data: {
        name,
        source: `http://mirror.example/mirror/${name}/v1/model.gguf`,
        engine: 'llamacpp',
        minReplicas: n,
        maxReplicas: n,
        ...extra,
      },
    });
    const replicas = [];
    for (const endpoint of endpoints) {
      const r = await db.replica.create({ data: { modelId: model.id, nodeId, state: 'READY', endpoint } });
      await db.engineKey.create({ data: { replicaId: r.id, key: KEY } });
      replicas.push(r);
    }
    return { model, replicas };
  });
  await t.app.services.gateway.routes.refresh();
  return { model, replicas };
}

const client = (apiKey = token) => new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });

beforeAll(async () => {
  // A short body deadline, so the test of a body that never ends is quick.
  // Short answer limits too, so the tests of a replica that goes quiet or never ends are quick.
  t = await startTestApp({
    HANGAR_BODY_TIMEOUT_MS: '1000',
    HANGAR_GATEWAY_IDLE_MS: '2000',
    HANGAR_GATEWAY_DEADLINE_SECONDS: '4',
    // Every client here is one address (loopback), and the wake queue's test holds 71 requests open at once.
    HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '1000',
  });
  base = await t.app.start();
  token = await t.token('VIEWER', 'an-application');
  replica = await startStandInReplica({ key: KEY });
  // A node that keeps reporting: one that never does is offline, and placement would take its replicas as lost.
  const node = await startReportingNode(t.app.db.prisma, 'gpu-1');
  stopNode = node.stop;
  nodeId = node.id;
  await addModel('tiny', [replica.endpoint]);
});

afterAll(async () => {
  stopNode?.();
  await replica?.close();
  await t?.close();
});

describe('the gateway at /v1', () => {
  it('answers a chat through the replica, with the engine key the caller never sees', async () => {
    const answer = await client().chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    let text = '';
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const chunk of answer) {
      chunks.push(chunk);
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(text).toBe(replica.words.join(''));
    const sent = replica.requests.at(-1);
    expect(sent?.authorization).toBe(`Bearer ${KEY}`);
    // The gateway asked for the usage chunk (to account the request) but the client did not: it gets none.
    expect(sent?.body.stream_options).toEqual({ include_usage: true });
    expect(chunks.some((c) => c.usage)).toBe(false);
  });

  it('passes the usage chunk on when the client asked for it', async () => {
    const answer = await client().chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const usage = [];
    for await (const chunk of answer) if (chunk.usage) usage.push(chunk.usage);
    expect(usage).toEqual([{ prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 }]);
  });

  it('never passes a caller’s own `lora` on, and names the adapter asked for by its place on the replica', async () => {
    const stream = async (model: string, extra: Record<string, unknown> = {}) => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], stream: true, ...extra }),
      });
      await res.text();
      return { status: res.status, sent: replica.requests.at(-1)?.body };
    };
    // llama-server would apply adapter 0 to a base-model request that carried this.
    const base1 = await stream('tiny', { lora: [{ id: 0, scale: 1 }] });
    expect(base1.status).toBe(200);
    expect(base1.sent).not.toHaveProperty('lora');
    const { model } = await addModel('with-adapters', []);
    const r = await t.app.db.prisma.replica.create({
      data: { modelId: model.id, nodeId, state: 'READY', endpoint: replica.endpoint, adapters: ['first', 'second'] },
    });
    await t.app.db.prisma.engineKey.create({ data: { replicaId: r.id, key: KEY } });
    for (const name of ['first', 'second']) {
      await t.app.db.prisma.adapter.create({
        data: { name, source: `http://mirror.example/mirror/${name}/v1/a.gguf`, modelId: model.id },
      });
    }
    await t.app.services.gateway.routes.refresh();
    const second = await stream('second', { lora: [{ id: 0, scale: 1 }] });
    expect(second.status).toBe(200);
    expect(second.sent).toMatchObject({ model: 'second', lora: [{ id: 1, scale: 1 }] });
  });

  it('accounts each request in a usage row, written in a batch', async () => {
    await t.app.services.gateway.usage.flush();
    const before = await t.app.db.prisma.usageMinute.aggregate({
      where: { model: 'tiny' },
      _sum: { requests: true, completionTokens: true },
    });
    const answer = await client().chat.completions.create({
      model: 'tiny',
      messages: [{ role: 'user', content: 'count me' }],
      stream: true,
    });
    for await (const _ of answer) {
      // read it all
    }
    // Nothing was written on the request's path.
    const unflushed = await t.app.db.prisma.usageMinute.aggregate({
      where: { model: 'tiny' },
      _sum: { requests: true },
    });
    expect(unflushed._sum.requests).toBe(before._sum.requests);
    await t.app.services.gateway.usage.flush();
    const after = await t.app.db.prisma.usageMinute.aggregate({
      where: { model: 'tiny' },
      _sum: { requests: true, completionTokens: true },
    });
    expect((after._sum.requests ?? 0) - (before._sum.requests ?? 0)).toBe(1);
    expect(Number(after._sum.completionTokens ?? 0n) - Number(before._sum.completionTokens ?? 0n)).toBe(3);
    const row = await t.app.db.prisma.usageMinute.findFirst({ where: { model: 'tiny' }, orderBy: { id: 'desc' } });
    expect(row?.node).toBe('gpu-1');
    expect(row?.durationBuckets.reduce((a, b) => a + b, 0)).toBe(row?.requests);
    const model = await t.app.db.prisma.catalogModel.findUnique({ where: { name: 'tiny' } });
    expect(model?.lastRequestAt).toBeInstanceOf(Date);
  });

  it('refuses a caller without a token, or with one that is not known, in OpenAI’s shape', async () => {
    const none = await fetch(`${base}/v1/models`);
    expect(none.status).toBe(401);
    expect(((await none.json()) as { error: { code: string } }).error.code).toBe('invalid_api_key');
    await expect(client('hgr_not-a-token').models.list()).rejects.toMatchObject({
      status: 401,
      code: 'invalid_api_key',
    });
  });

  it('refuses a revoked token at once, though callers are kept for a few seconds', async () => {
    const admin = await t.login();
    const made = await t.gql(
      'mutation { createApiToken(input: { name: "soon-revoked", role: VIEWER }) { ... on CreatedApiToken { secret token { id } } } }',
      {},
      admin,
    );
    const { secret, token: created } = made.data!.createApiToken as { secret: string; token: { id: string } };
    expect((await client(secret).models.list()).data.length).toBeGreaterThan(0);
    await t.gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id: created.id }, admin);
    // The revocation's event drops the kept caller; without it the token would stand for 5 s more.
    const deadline = Date.now() + 1500;
    let status = 200;
    while (Date.now() < deadline && status === 200) {
      status = (await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${secret}` } })).status;
      if (status === 200) await new Promise((r) => setTimeout(r, 50));
    }
    expect(status).toBe(401);
  });

  it('answers a name nobody has and one the caller may not see exactly alike', async () => {
    await addModel('restricted', [replica.endpoint], { owner: 'team:00000000-0000-4000-8000-000000000001' });
    const ask = async (model: string) => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
      });
      return { status: res.status, body: (await res.text()).replace(model, 'NAME') };
    };
    const hidden = await ask('restricted');
    const unknown = await ask('made-up');
    expect(hidden.status).toBe(404);
    expect(hidden).toEqual(unknown);
    const listed = (await client().models.list()).data.map((m) => m.id);
    expect(listed).toContain('tiny');
    expect(listed).not.toContain('restricted');
    // An admin calls everything.
    const admin = await t.token('ADMIN', 'admin-app');
    expect((await client(admin).models.list()).data.map((m) => m.id)).toContain('restricted');
  });

  it('refuses a body that is not JSON, one without a model, and one too large, naming what is wrong', async () => {
    const post = (body: string) =>
      fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body,
      });
    const notJson = await post('{"model": ');
    expect(notJson.status).toBe(400);
    expect(((await notJson.json()) as { error: { message: string } }).error.message).toMatch(
      /could not parse the JSON/,
    );
    const noModel = await post('{"messages": []}');
    expect(noModel.status).toBe(400);
    expect(((await noModel.json()) as { error: { param: string } }).error.param).toBe('model');
    const large = await post(
      JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'x'.repeat(5 << 20) }] }),
    );
    expect(large.status).toBe(413);
    const unknownRoute = await fetch(`${base}/v1/files`, { headers: { authorization: `Bearer ${token}` } });
    expect(unknownRoute.status).toBe(404);
    expect(((await unknownRoute.json()) as { error: { code: string } }).error.code).toBe('unknown_url');
  });

  it('cuts off a body that never ends, in OpenAI’s shape', async () => {
    const { port } = new URL(base);
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request({
        host: '127.0.0.1',
        port,
        path: '/v1/chat/completions',
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-length': '1000' },
      });
      req.on('response', (res) => resolve(res.statusCode ?? 0));
      req.on('error', reject);
      req.write('{"model": "tiny"');
    });
    expect(status).toBe(408);
  });

  it('sends a request whose replica cannot be reached, or fails before its first byte, to another one', async () => {
    const closedPort = await freePort();
    const failing = http.createServer((_req, res) => {
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom"}}');
    });
    await new Promise<void>((r) => failing.listen(0, '127.0.0.1', r));
    const failingUrl = `http://127.0.0.1:${(failing.address() as AddressInfo).port}/v1`;
    try {
      for (const [name, bad, why] of [
        ['refusing', `http://127.0.0.1:${closedPort}/v1`, /ECONNREFUSED/],
        ['erring', failingUrl, /answered 500/],
      ] as const) {
        // Least-loaded: ties are taken in turn, so one of two requests picks the bad replica first (by prefix, two
        // identical prompts would go to one replica, and the other might never be tried).
        const { replicas } = await addModel(name, [bad, replica.endpoint], { routing: 'LEAST_LOADED' });
        for (let i = 0; i < 2; i++) {
          const answer = await client().chat.completions.create({
            model: name,
            messages: [{ role: 'user', content: 'hi' }],
            stream: true,
          });
          let text = '';
          for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
          expect(text).toBe(replica.words.join(''));
        }
        expect(t.app.services.gateway.load(replicas[0]!.id).failing).toMatch(why);
        expect(t.app.services.gateway.load(replicas[1]!.id)).toMatchObject({ inFlight: 0, failing: null });
      }
    } finally {
      failing.close();
    }
  });

  it('answers 503 with the reason and Retry-After for a stopped model', async () => {
    await addModel('parked', [], { minReplicas: 0, maxReplicas: 0 });
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'parked', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('60');
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/stopped by an operator/);
  });
});

/** A replica's endpoint that answers every request as `answer` says: a refusal, an HTML page, a stream. */
async function oddReplica(answer: (req: http.IncomingMessage, res: http.ServerResponse) => void) {
  const server = http.createServer((req, res) => {
    req.resume();
    req.once('end', () => answer(req, res));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

const chat = (model: string, apiKey = token, extra: Record<string, unknown> = {}) =>
  fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], ...extra }),
  });

describe('what a replica says that the gateway does not pass on', () => {
  it('answers a replica’s 401 (a model being stopped) with 503 and the model’s state, never the node’s refusal', async () => {
    // A replica that no longer takes the gateway's key, as a node's endpoint does for the half second between an
    // operator's stop and the route table's next refresh: its 401 quotes the key it got.
    const stopping = await startStandInReplica({ key: 'hgk_the-key-the-node-holds-now-0123456789' });
    try {
      const { model } = await addModel('stopping', [stopping.endpoint]);
      const first = await client()
        .chat.completions.create({ model: 'stopping', messages: [{ role: 'user', content: 'hi' }] })
        .catch((e: unknown) => e);
      expect(first).toBeInstanceOf(OpenAI.APIError);
      const err = first as InstanceType<typeof OpenAI.APIError>;
      expect(err.status).toBe(503);
      expect(err.code).toBe('model_unavailable');
      expect(err.message).toMatch(/stopping.*gpu-1.*401/);
      expect(err.headers?.get('retry-after')).toBeTruthy();
      expect(JSON.stringify(err.error)).not.toContain(KEY);
      expect(stopping.errorBodies.at(-1)).toContain(KEY);

      // The operator's stop, not yet in the route table: the answer says so.
      await t.app.db.prisma.catalogModel.update({ where: { id: model.id }, data: { minReplicas: 0, maxReplicas: 0 } });
      const res = await chat('stopping');
      expect(res.status).toBe(503);
      expect(res.headers.get('x-content-type-options')).toBe('nosniff');
      const text = await res.text();
      expect(text).not.toContain(KEY);
      expect((JSON.parse(text) as { error: { message: string } }).error.message).toMatch(/stopped by an operator/);
    } finally {
      await stopping.close();
    }
  });

  it('passes a replica’s 4xx on without the engine key it quotes', async () => {
    const quoting = await oddReplica((req, res) => {
      const bearer = req.headers.authorization?.replace(/^Bearer /, '') ?? '';
      const masked = `${bearer.slice(0, 8)}****${bearer.slice(-4)}`;
      res.writeHead(400, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          error: {
            message: `key ${bearer} (${masked}) may not use this context size`,
            type: 'invalid_request_error',
            param: null,
            code: null,
          },
        }),
      );
    });
    try {
      await addModel('quoting', [quoting.endpoint]);
      const res = await chat('quoting');
      expect(res.status).toBe(400);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      const text = await res.text();
      expect(text).not.toContain(KEY);
      expect(text).not.toContain(KEY.slice(0, 8));
      expect(text).not.toContain(KEY.slice(-4));
      expect(JSON.parse(text)).toMatchObject({ error: { type: 'invalid_request_error' } });
    } finally {
      quoting.close();
    }
  });

  it('never relays a replica’s HTML, and marks every /v1 answer nosniff', async () => {
    const html = await oddReplica((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<script>alert(document.cookie)</script>');
    });
    try {
      await addModel('html', [html.endpoint]);
      const res = await chat('html');
      expect(res.status).toBe(502);
      expect(res.headers.get('content-type')).toMatch(/^application\/json/);
      expect(res.headers.get('x-content-type-options')).toBe('nosniff');
      const text = await res.text();
      expect(text).not.toContain('<script>');
      expect(JSON.parse(text)).toMatchObject({ error: { type: 'server_error' } });
    } finally {
      html.close();
    }
    const answers = [
      await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${token}` } }),
      await fetch(`${base}/v1/models`),
      await fetch(`${base}/v1/files`, { headers: { authorization: `Bearer ${token}` } }),
      await chat('made-up'),
      await chat('tiny'),
      await chat('tiny', token, { stream: true }),
    ];
    for (const res of answers) {
      await res.text();
      expect(res.headers.get('x-content-type-options'), `${res.status} ${res.url}`).toBe('nosniff');
    }
  });
});

describe('requests the gateway cannot pass on as they came', () => {
  it('refuses JSON nested 1,000,000 deep in OpenAI’s shape', async () => {
    // Streamed, so the gateway adds stream_options and writes the body out again.
    const deep = `{"model":"tiny","stream":true,"messages":${'['.repeat(1_000_000)}${']'.repeat(1_000_000)}}`;
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: deep,
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { type: 'invalid_request_error' } });
  });

  it('answers a model name that is not percent-encoded UTF-8 in OpenAI’s shape', async () => {
    const res = await fetch(`${base}/v1/models/%E0%A4%A`, { headers: { authorization: `Bearer ${token}` } });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { type: 'invalid_request_error' } });
  });
});

describe('a replica stream that goes quiet or never ends', () => {
  it('is cut after HANGAR_GATEWAY_IDLE_MS without a byte, and the client is told why', async () => {
    const quiet = await startStandInReplica({ key: KEY });
    const release = quiet.hold();
    try {
      await addModel('quiet', [quiet.endpoint]);
      const answer = await client().chat.completions.create({
        model: 'quiet',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      let text = '';
      const ended = await (async () => {
        for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
      })().catch((e: unknown) => e);
      expect(text).toBe(quiet.words[0]);
      expect(String(ended)).toMatch(/HANGAR_GATEWAY_IDLE_MS/);
      // The replica's work was given up: its connection closed.
      await expect.poll(() => quiet.open()).toBe(0);
    } finally {
      release();
      await quiet.close();
    }
  });

  it('is cut at HANGAR_GATEWAY_DEADLINE_SECONDS though it keeps sending', async () => {
    const endless = await oddReplica((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = { id: 'x', object: 'chat.completion.chunk', created: 1, model: 'endless' };
      const timer = setInterval(() => {
        res.write(
          `data: ${JSON.stringify({ ...chunk, choices: [{ index: 0, delta: { content: '.' }, finish_reason: null }] })}\n\n`,
        );
      }, 100);
      res.once('close', () => clearInterval(timer));
    });
    try {
      await addModel('endless', [endless.endpoint]);
      const answer = await client().chat.completions.create({
        model: 'endless',
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
      });
      let dots = 0;
      const ended = await (async () => {
        for await (const chunk of answer) dots += (chunk.choices[0]?.delta?.content ?? '').length;
      })().catch((e: unknown) => e);
      expect(dots).toBeGreaterThan(0);
      expect(String(ended)).toMatch(/HANGAR_GATEWAY_DEADLINE_SECONDS/);
    } finally {
      endless.close();
    }
  });
});

describe('waiting for a model', () => {
  it('keeps a share of the wake queue for other callers while one sends 70 requests', async () => {
    await addModel('sleepy', [], { minReplicas: 0, maxReplicas: 1 });
    // Another user's token: a user's share counts all their tokens together.
    const admin = await t.login();
    await t.gql(
      'mutation($i: CreateUserInput!) { createUser(input: $i) { __typename } }',
      { i: { email: 'other@example.com', name: 'Other', role: 'VIEWER', password: 'a-long-enough-password' } },
      admin,
    );
    const otherSession = await t.login('other@example.com', 'a-long-enough-password');
    const made = await t.gql(
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { ... on CreatedApiToken { secret } } }',
      { i: { name: 'another-application', role: 'VIEWER' } },
      otherSession,
    );
    const other = made.data?.createApiToken.secret as string;
    const gateway = t.app.services.gateway;
    const flood = Array.from({ length: 70 }, () =>
      chat('sleepy').then(async (res) => ({ status: res.status, text: await res.text() })),
    );
    // Each of the flood's requests is either waiting or already answered.
    let settled = 0;
    for (const p of flood) void p.then(() => settled++);
    await expect.poll(() => gateway.waiting('sleepy') + settled, { timeout: 20_000 }).toBe(70);
    // The stand-in streams every answer: asked for a stream, as it would be.
    const theirs = client(other)
      .chat.completions.create({ model: 'sleepy', messages: [{ role: 'user', content: 'hi' }], stream: true })
      .then(async (answer) => {
        let text = '';
        for await (const chunk of answer) text += chunk.choices[0]?.delta?.content ?? '';
        return text;
      });
    // Before it is answered, it either waits as well or (as it was) is refused at once.
    let theirsDone = false;
    void theirs.then(
      () => {
        theirsDone = true;
      },
      () => {
        theirsDone = true;
      },
    );
    const waitingBefore = gateway.waiting('sleepy');
    await expect.poll(() => theirsDone || gateway.waiting('sleepy') > waitingBefore, { timeout: 20_000 }).toBe(true);
    // The model wakes: the replica the wake placed becomes READY, as its agent would report it.
    const db = t.app.db.prisma;
    const placed = () => db.replica.findFirst({ where: { model: { name: 'sleepy' }, state: 'PENDING' } });
    // The wake's placement pass may wait for one already under way.
    await expect.poll(placed, { timeout: 15_000 }).toBeTruthy();
    const woken = (await placed())!;
    await db.replica.update({ where: { id: woken.id }, data: { nodeId, state: 'READY', endpoint: replica.endpoint } });
    await db.engineKey.create({ data: { replicaId: woken.id, key: KEY } });
    await gateway.routes.refresh();
    expect(await theirs).toBe(replica.words.join(''));
    const flooded = await Promise.all(flood);
    const served = flooded.filter((f) => f.status === 200).length;
    const refused = flooded.filter((f) => f.status === 503);
    expect(served + refused.length).toBe(70);
    expect(served).toBeGreaterThan(0);
    expect(refused[0]?.text).toMatch(/HANGAR_GATEWAY_WAKE_QUEUE/);
  });

  it('answers an ALWAYS model whose only replica failed at once, with the reason', async () => {
    const { model } = await addModel('broken', [], { minReplicas: 1, maxReplicas: 1 });
    await t.app.db.prisma.replica.create({
      data: { modelId: model.id, nodeId, state: 'FAILED', message: 'llama.cpp could not load the file: bad magic' },
    });
    // Placement adds the replica it wants and says why it can place it nowhere.
    await t.app.services.fleet.place();
    await t.app.services.gateway.routes.refresh();
    const res = await chat('broken');
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBeTruthy();
    const body = (await res.json()) as { error: { message: string; code: string } };
    expect(body.error.code).toBe('model_unavailable');
    expect(body.error.message).toMatch(/bad magic/);
    expect(body.error.message).not.toMatch(/HANGAR_GATEWAY_WAKE_SECONDS/);
  });
});
