import fs from 'node:fs/promises';
import path from 'node:path';
import { serverAudits } from 'graphql-http';
import { createClient } from 'graphql-ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from './harness.js';

let t: TestApp;
let url: string;
beforeAll(async () => {
  t = await startTestApp();
  // A built console stand-in, so the fallback to index.html can be checked without building the web package.
  const dist = path.join(t.dataDir, 'no-web-dist');
  await fs.mkdir(path.join(dist, 'assets'), { recursive: true });
  await fs.writeFile(path.join(dist, 'index.html'), '<!doctype html><title>Hangar</title>');
  await fs.writeFile(path.join(dist, 'assets', 'app-1234.js'), 'console.log(1)');
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

  it('serves the console with client-side routes falling back to index.html', async () => {
    const route = await fetch(`${url}/audit?first=10`);
    expect(route.status).toBe(200);
    expect(await route.text()).toContain('<title>Hangar</title>');
    const asset = await fetch(`${url}/assets/app-1234.js`);
    expect(asset.headers.get('cache-control')).toContain('immutable');
    expect((await fetch(`${url}/assets/gone-0000.js`)).status).toBe(404);
    expect((await fetch(`${url}/..%2f..%2fetc/passwd`)).status).toBe(404);
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
