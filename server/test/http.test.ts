import fs from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import zlib from 'node:zlib';
import { serverAudits } from 'graphql-http';
import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from './harness.js';

let t: TestApp;
let url: string;
const BIG_ASSET = Array.from({ length: 400 }, (_, i) => `export const row${i} = { id: ${i}, name: "row ${i}" };`).join(
  '\n',
);
beforeAll(async () => {
  t = await startTestApp();
  // A built console stand-in, so the fallback to index.html can be checked without building the web package.
  const dist = path.join(t.dataDir, 'no-web-dist');
  await fs.mkdir(path.join(dist, 'assets'), { recursive: true });
  await fs.writeFile(path.join(dist, 'index.html'), '<!doctype html><title>Hangar</title>');
  await fs.writeFile(path.join(dist, 'assets', 'app-1234.js'), 'console.log(1)');
  await fs.writeFile(path.join(dist, 'assets', 'big-5678.js'), BIG_ASSET);
  url = await t.app.start();
});
afterAll(() => t.close());

describe('GraphQL over HTTP', () => {
  // The spec's own audit suite: MUST audits answer "error" when broken, SHOULD audits "warn". As a signed-in
  // script: some audits ask for __type, which anonymous callers are refused (test/edge-security.test.ts).
  let token: string | undefined;
  const fetchFn: typeof fetch = async (input, init) => {
    token ??= await t.token('VIEWER', 'graphql-http-audits');
    const headers = new Headers(init?.headers);
    headers.set('authorization', `Bearer ${token}`);
    return fetch(input, { ...init, headers });
  };
  for (const audit of serverAudits({ url: () => `${url}/graphql`, fetchFn })) {
    it(`${audit.id} ${audit.name}`, async () => {
      const result = await audit.fn();
      if (result.status === 'warn') console.warn(`${audit.id}: ${result.reason}`);
      expect(result.status === 'error' ? `${result.reason}` : 'ok').toBe('ok');
    });
  }
});

describe('the HTTP edge', () => {
  it('answers /healthz and /readyz', async () => {
    expect(await (await fetch(`${url}/healthz`)).json()).toEqual({ ok: true });
    const ready = await fetch(`${url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ ready: true });
  });

  it('says on /readyz which migration the database lacks, and is ready again once it has it', async () => {
    // Asked twice before, so that the list of this build's migrations (read once, app.ts) is the one in use.
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    const [last] = await t.app.db.prisma.$queryRawUnsafe<{ migration_name: string }[]>(
      'SELECT migration_name FROM "_prisma_migrations" ORDER BY migration_name DESC LIMIT 1',
    );
    const name = last?.migration_name as string;
    const setRolledBack = (sql: string) =>
      t.app.db.prisma.$executeRawUnsafe(
        `UPDATE "_prisma_migrations" SET rolled_back_at = ${sql} WHERE migration_name = $1`,
        name,
      );
    await setRolledBack('now()');
    try {
      const lacking = await fetch(`${url}/readyz`);
      expect(lacking.status).toBe(503);
      expect(await lacking.json()).toEqual({ ready: false, reason: `migrations not applied: ${name}` });
    } finally {
      await setRolledBack('NULL');
    }
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
  });

  it('serves the console with client-side routes falling back to index.html', async () => {
    const route = await fetch(`${url}/audit?first=10`);
    expect(route.status).toBe(200);
    expect(await route.text()).toContain('<title>Hangar</title>');
    const asset = await fetch(`${url}/assets/app-1234.js`);
    expect(asset.headers.get('cache-control')).toContain('immutable');
    expect((await fetch(`${url}/assets/gone-0000.js`)).status).toBe(404);
    expect((await fetch(`${url}/..%2f..%2fetc/passwd`)).status).toBe(404);
  });

  it("answers an unknown API path with a 404 in JSON, never the console's page", async () => {
    for (const p of ['/api/nope', '/api', '/api/train/nope/x', '/hf/api/models', '/graphql/extra']) {
      const r = await fetch(`${url}${p}`);
      expect([p, r.status, r.headers.get('content-type')]).toEqual([p, 404, 'application/json']);
      expect(((await r.json()) as { code: string }).code).toBe('NOT_FOUND');
    }
    // /v1 speaks OpenAI's error shape, the bare prefix included.
    for (const p of ['/v1', '/v1/nope']) {
      const r = await fetch(`${url}${p}`);
      expect([p, r.status]).toEqual([p, 404]);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe('unknown_url');
    }
    // The mirror's file server answers for itself (plain text, as a file server does; 401 before any 404 when it
    // needs a token), never with the console's page.
    const file = await fetch(`${url}/mirror/no/such/file.gguf`);
    expect([file.status, file.headers.get('content-type')]).toEqual([401, 'text/plain; charset=utf-8']);
    // The console's own pages of the same first word are still the console's.
    expect(await (await fetch(`${url}/mirror`)).text()).toContain('<title>Hangar</title>');
  });

  it('serves GraphiQL without reaching a CDN', async () => {
    const page = await (await fetch(`${url}/graphql`, { headers: { accept: 'text/html' } })).text();
    expect(page).toContain('graphiql');
    expect(page).not.toMatch(/unpkg\.com|jsdelivr|cdn\./);
  });

  it('refuses an oversized body before reading it', async () => {
    const big = JSON.stringify({ query: `{ __typename }`, variables: { pad: 'x'.repeat(2 << 20) } });
    const r = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: big,
    });
    expect(r.status).toBe(413);
    expect(JSON.stringify(await r.json())).toMatch(/limit is 1048576 \(HANGAR_MAX_BODY_BYTES\)/);
  });

  // Yoga's own body limit is off (graphql/yoga.ts): a body without a length, one that never ends, must still be
  // refused up front.
  it('refuses a chunked body that never ends, without waiting for its end', async () => {
    const target = new URL(`${url}/graphql`);
    const endless = await new Promise<{ status?: number; text: string }>((resolve, reject) => {
      const req = http.request(
        { host: target.hostname, port: target.port, path: '/graphql', method: 'POST' },
        (res) => {
          let text = '';
          res.on('data', (c) => (text += c));
          res.on('end', () => resolve({ status: res.statusCode, text }));
        },
      );
      req.on('error', reject);
      req.setHeader('content-type', 'application/json');
      req.write('{"query":"{ __typename }", "pad":"'); // and never ends
      const more = setInterval(() => req.write('x'.repeat(1024)), 20);
      req.on('close', () => clearInterval(more));
    });
    expect(endless.status).toBe(411);
    expect(endless.text).toMatch(/a POST to \/graphql needs a Content-Length header/);
  });

  it('refuses a query nested too deep, over HTTP and WebSocket alike', async () => {
    const token = await t.token('VIEWER');
    let nested = 'name';
    for (let i = 0; i < 7; i++) nested = `apiTokens { owner { ${nested} } }`;
    nested = `{ viewer { user { ${nested} } } }`;
    const r = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ query: nested }),
    });
    const body = (await r.json()) as { errors?: { message: string }[] };
    expect(body.errors?.[0]?.message).toMatch(/Query depth limit of 12 exceeded/);

    const ws = createClient({
      url: `${url.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${token}` },
    });
    const viaWs = await new Promise<unknown>((resolve) => {
      ws.subscribe({ query: nested }, { next: resolve, error: resolve, complete: () => {} });
    });
    expect(JSON.stringify(viaWs)).toMatch(/Query depth limit of 12 exceeded/);
    await ws.dispose();
  });

  it('refuses too many aliases', async () => {
    const token = await t.token('VIEWER');
    const aliased = `{ ${Array.from({ length: 30 }, (_, i) => `a${i}: viewer { role }`).join(' ')} }`;
    const r = await t.gql(aliased, {}, { token });
    expect(r.errors?.[0]?.message).toMatch(/Aliases limit of 20 exceeded/);
  });

  it('gives field suggestions only to signed-in callers', async () => {
    const anonymous = await t.gql('{ nodez { id } }');
    expect(anonymous.errors?.[0]?.message).toBe('Cannot query field "nodez" on type "Query".');
    const token = await t.token('VIEWER');
    const signedIn = await t.gql('{ nodez { id } }', {}, { token });
    expect(signedIn.errors?.[0]?.message).toMatch(/Did you mean "nodes"/);
  });

  it('masks unexpected errors and gives the request id', async () => {
    const token = await t.token('VIEWER');
    // A failure the resolver did not expect: the database goes away under it.
    const broken = t.app.db.prisma.node.findMany;
    t.app.db.prisma.node.findMany = (() =>
      Promise.reject(new Error('connection reset by peer: secret-host:5432'))) as never;
    const r = await t.gql('{ nodes { id } }', {}, { token });
    t.app.db.prisma.node.findMany = broken;
    expect(r.errors?.[0]?.message).toBe('Unexpected error.');
    expect(r.errors?.[0]?.extensions?.requestId).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.stringify(r)).not.toContain('secret-host');
  });
});

describe('live updates', () => {
  const SUB = 'subscription { auditEventAdded { action target outcome actor } }';

  it('streams audit events over graphql-ws to a token holder', async () => {
    const token = await t.token('VIEWER', 'ws-watcher');
    const admin = await t.token('ADMIN', 'ws-admin');
    const client = createClient({
      url: `${url.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${token}` },
    });
    type Event = { auditEventAdded: { target: string } };
    const got = new Promise<Event>((resolve, reject) => {
      client.subscribe<Event>(
        { query: SUB },
        {
          next: (v) => v.data?.auditEventAdded.target === 'gpu-ws' && resolve(v.data),
          error: reject,
          complete: () => {},
        },
      );
    });
    await new Promise((r) => setTimeout(r, 200));
    await t.gql('mutation { createNode(name: "gpu-ws") { __typename } }', {}, { token: admin });
    expect(await got).toEqual({
      auditEventAdded: {
        action: 'createNode',
        target: 'gpu-ws',
        outcome: 'DONE',
        actor: 'token:ws-admin (admin@example.com)',
      },
    });
    await client.dispose();
  });

  it('streams over SSE too', async () => {
    const token = await t.token('VIEWER', 'sse-watcher');
    const admin = await t.token('ADMIN', 'sse-admin');
    const ctrl = new AbortController();
    const res = await fetch(`${url}/graphql`, {
      method: 'POST',
      signal: ctrl.signal,
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${token}` },
      body: JSON.stringify({ query: SUB }),
    });
    expect(res.headers.get('content-type')).toMatch(/text\/event-stream/);
    const reader = res.body!.getReader();
    setTimeout(() => t.gql('mutation { createNode(name: "gpu-sse") { __typename } }', {}, { token: admin }), 200);
    let text = '';
    while (!text.includes('gpu-sse')) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    ctrl.abort();
    expect(text).toContain('"action":"createNode","target":"gpu-sse","outcome":"DONE"');
  });

  it('refuses a WebSocket from a foreign origin', async () => {
    const ws = new WebSocket(`${url.replace('http', 'ws')}/graphql`, 'graphql-transport-ws', {
      headers: { origin: 'https://evil.example' },
    });
    const status = await new Promise<number>((resolve) =>
      ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0)),
    );
    expect(status).toBe(403);
  });

  it('closes an anonymous WebSocket with 4403', async () => {
    const client = createClient({
      url: `${url.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      retryAttempts: 0,
    });
    const closed = await new Promise<unknown>((resolve) => {
      client.subscribe({ query: SUB }, { next: () => {}, error: resolve, complete: () => {} });
    });
    expect((closed as { code?: number }).code).toBe(4403);
    await client.dispose();
  });
});

/** One request over a real socket, the body as the bytes that came (fetch would decompress them unasked). */
function raw(
  at: string,
  o: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${at}`, { method: o.method ?? 'GET', headers: o.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end(o.body);
  });
}

function decoded(r: { headers: http.IncomingHttpHeaders; body: Buffer }): string {
  const encoding = r.headers['content-encoding'];
  if (encoding === 'br') return zlib.brotliDecompressSync(r.body).toString();
  if (encoding === 'gzip') return zlib.gunzipSync(r.body).toString();
  return r.body.toString();
}

describe('compression', () => {
  let token: string;
  beforeAll(async () => {
    token = await t.token('VIEWER', 'compression');
  });
  const ask = (query: string, acceptEncoding?: string) =>
    raw('/graphql', {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${token}`,
        ...(acceptEncoding ? { 'accept-encoding': acceptEncoding } : {}),
      },
      body: JSON.stringify({ query }),
    });

  it('compresses a GraphQL answer for a client that accepts it, and only then', async () => {
    const query = '{ __schema { types { name description } } }';
    const plain = await ask(query);
    expect(plain.status).toBe(200);
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.headers.vary).toMatch(/accept-encoding/i);
    expect(plain.body.length).toBeGreaterThan(4096);
    const text = plain.body.toString();
    expect(JSON.parse(text).data.__schema.types.length).toBeGreaterThan(20);

    const br = await ask(query, 'gzip, deflate, br');
    expect(br.headers['content-encoding']).toBe('br');
    expect(br.headers.vary).toMatch(/accept-encoding/i);
    expect(Number(br.headers['content-length'])).toBe(br.body.length);
    expect(br.body.length).toBeLessThan(plain.body.length / 3);
    expect(decoded(br)).toBe(text);

    const gzip = await ask(query, 'gzip;q=1, br;q=0');
    expect(gzip.headers['content-encoding']).toBe('gzip');
    expect(decoded(gzip)).toBe(text);

    expect((await ask(query, 'identity')).headers['content-encoding']).toBeUndefined();
    // A few bytes are not worth the encoding's own overhead.
    const tiny = await ask('{ __typename }', 'br');
    expect(tiny.headers['content-encoding']).toBeUndefined();
    expect(JSON.parse(tiny.body.toString())).toEqual({ data: { __typename: 'Query' } });
  });

  it("compresses the console's assets once, and serves them as they are to a client that does not accept it", async () => {
    const plain = await raw('/assets/big-5678.js');
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.headers.vary).toMatch(/accept-encoding/i);
    expect(plain.body.toString()).toBe(BIG_ASSET);
    for (const encoding of ['br', 'gzip'] as const) {
      const packed = await raw('/assets/big-5678.js', { headers: { 'accept-encoding': encoding } });
      expect(packed.headers['content-encoding']).toBe(encoding);
      expect(packed.headers['cache-control']).toContain('immutable');
      expect(Number(packed.headers['content-length'])).toBe(packed.body.length);
      expect(packed.body.length).toBeLessThan(BIG_ASSET.length / 4);
      expect(decoded(packed)).toBe(BIG_ASSET);
      const head = await raw('/assets/big-5678.js', { method: 'HEAD', headers: { 'accept-encoding': encoding } });
      expect(head.headers['content-length']).toBe(packed.headers['content-length']);
      expect(head.body.length).toBe(0);
    }
    const tiny = await raw('/assets/app-1234.js', { headers: { 'accept-encoding': 'br' } });
    expect(tiny.headers['content-encoding']).toBeUndefined();
    expect(tiny.body.toString()).toBe('console.log(1)');
  });

  it('leaves an SSE subscription uncompressed, so its events arrive as they happen', async () => {
    const admin = await t.token('ADMIN', 'sse-compression-admin');
    const req = http.request(`${url}/graphql`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'text/event-stream',
        'accept-encoding': 'br, gzip',
        authorization: `Bearer ${token}`,
      },
    });
    req.end(JSON.stringify({ query: 'subscription { auditEventAdded { target } }' }));
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      req.on('response', resolve);
      req.on('error', reject);
    });
    expect(res.headers['content-type']).toMatch(/text\/event-stream/);
    // Yoga says "none" outright, so no proxy in between compresses the stream either.
    expect(res.headers['content-encoding'] ?? 'none').toBe('none');
    let text = '';
    const arrived = new Promise<void>((resolve) =>
      res.on('data', (c: Buffer) => {
        text += c.toString();
        if (text.includes('gpu-sse-plain')) resolve();
      }),
    );
    setTimeout(() => t.gql('mutation { createNode(name: "gpu-sse-plain") { __typename } }', {}, { token: admin }), 200);
    await arrived; // while the stream is still open: nothing held it back in a compressor
    expect(text).toContain('"target":"gpu-sse-plain"');
    req.destroy();
  });
});
