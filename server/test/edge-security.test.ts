import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { z } from 'zod';
import { createApp } from '../src/app.js';
import { ConfigError, loadConfig } from '../src/config.js';
import { createPrisma } from '../src/db/client.js';
import { parseInput } from '../src/lib/validate.js';
import { ADMIN_EMAIL, ADMIN_PASSWORD, freshDatabase, startTestApp, type TestApp } from './harness.js';

// The HTTP edge against what a hostile page, a hostile client or a lost database does to it (issue #11).

const LISTED = 'https://tools.example.com';
const ELSEWHERE = 'http://127.0.0.1:9';

let t: TestApp;
let url: string;
let admin: string;
beforeAll(async () => {
  t = await startTestApp({ HANGAR_CORS_ORIGINS: LISTED });
  const dist = path.join(t.dataDir, 'no-web-dist');
  await fs.mkdir(path.join(dist, 'assets'), { recursive: true });
  await fs.writeFile(path.join(dist, 'index.html'), '<!doctype html><title>Hangar</title>');
  url = await t.app.start();
  admin = await t.token('ADMIN', 'edge-admin');
});
afterAll(() => t.close());

const USERS = '{ users { email } apiTokens(all: true) { name } }';

describe('CORS', () => {
  it('gives a page on another origin no grant, with or without credentials', async () => {
    const { cookie, csrf } = await t.login();
    const r = await fetch(`${url}/graphql`, {
      method: 'POST',
      headers: { origin: ELSEWHERE, cookie, 'x-hangar-csrf': csrf, 'content-type': 'application/json' },
      body: JSON.stringify({ query: USERS }),
    });
    expect(r.headers.get('access-control-allow-origin')).toBeNull();
    expect(r.headers.get('access-control-allow-credentials')).toBeNull();
  });

  it('refuses the preflight a foreign page needs to send the CSRF header', async () => {
    const r = await fetch(`${url}/graphql`, {
      method: 'OPTIONS',
      headers: {
        origin: ELSEWHERE,
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'content-type, x-hangar-csrf',
      },
    });
    expect(r.headers.get('access-control-allow-origin')).toBeNull();
    expect(r.headers.get('access-control-allow-headers')).toBeNull();
    expect(r.headers.get('access-control-allow-methods')).toBeNull();
  });

  it('grants an origin listed in HANGAR_CORS_ORIGINS, with credentials', async () => {
    const pre = await fetch(`${url}/graphql`, {
      method: 'OPTIONS',
      headers: {
        origin: LISTED,
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'content-type, x-hangar-csrf',
      },
    });
    expect(pre.headers.get('access-control-allow-origin')).toBe(LISTED);
    expect(pre.headers.get('access-control-allow-credentials')).toBe('true');
    expect(pre.headers.get('access-control-allow-headers')).toContain('x-hangar-csrf');
    const r = await t.gql('{ __typename }', {}, { headers: { origin: LISTED } });
    expect(r.headers.get('access-control-allow-origin')).toBe(LISTED);
    // A listed origin that differs only in port or scheme is another origin.
    const near = await t.gql('{ __typename }', {}, { headers: { origin: 'http://tools.example.com' } });
    expect(near.headers.get('access-control-allow-origin')).toBeNull();
  });

  it('opens the WebSocket to a listed origin only', async () => {
    const status = (origin: string) =>
      new Promise<number>((resolve) => {
        const ws = new WebSocket(`${url.replace('http', 'ws')}/graphql`, 'graphql-transport-ws', {
          headers: { origin },
        });
        ws.on('upgrade', () => {
          resolve(101);
          ws.terminate();
        });
        ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
        ws.on('error', () => {});
      });
    expect(await status(ELSEWHERE)).toBe(403);
    expect(await status(LISTED)).toBe(101);
  });

  it('accepts only exact origins in HANGAR_CORS_ORIGINS', () => {
    const env = { HANGAR_DATA_DIR: os.tmpdir() };
    expect(loadConfig({ ...env, HANGAR_CORS_ORIGINS: `${LISTED}, http://127.0.0.1:5173` }).corsOrigins).toEqual([
      LISTED,
      'http://127.0.0.1:5173',
    ]);
    for (const bad of [`${LISTED}/`, 'tools.example.com', `${LISTED}/app`, 'ftp://tools.example.com', '*']) {
      expect(() => loadConfig({ ...env, HANGAR_CORS_ORIGINS: bad })).toThrow(ConfigError);
    }
    expect(() => loadConfig({ ...env, HANGAR_CORS_ORIGINS: '*' })).toThrow(/HANGAR_CORS_ORIGINS="\*".*origins/);
  });
});

describe('framing and CSP', () => {
  it('forbids framing the console and sets a restrictive policy', async () => {
    for (const page of ['/', '/mirror', '/no-such-asset.js']) {
      const r = await fetch(`${url}${page}`);
      expect(r.headers.get('x-frame-options')).toBe('DENY');
      expect(r.headers.get('x-content-type-options')).toBe('nosniff');
      expect(r.headers.get('referrer-policy')).toBe('no-referrer');
      const csp = r.headers.get('content-security-policy') ?? '';
      expect(csp).toContain("frame-ancestors 'none'");
      expect(csp).toContain("script-src 'self'");
      expect(csp).toContain("default-src 'self'");
      expect(csp).not.toContain('unsafe');
    }
  });

  it('forbids framing GraphiQL too', async () => {
    const r = await fetch(`${url}/graphql`, { headers: { accept: 'text/html' } });
    expect(r.headers.get('content-type')).toMatch(/text\/html/);
    expect(r.headers.get('x-frame-options')).toBe('DENY');
    expect(r.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    await r.text();
  });
});

describe('introspection', () => {
  const queries = {
    schema: '{ __schema { queryType { name } } }',
    type: '{ __type(name: "User") { fields { name } } }',
    fragment: 'query { ...F } fragment F on Query { __schema { types { name } } }',
  };

  it('is refused to anonymous callers, with a code, and open to signed-in ones, per request', async () => {
    for (const query of Object.values(queries)) {
      // In both orders: Yoga caches validation per document, so the answer must not be cached with it.
      for (const order of [0, 1]) {
        for (const who of order ? ['anonymous', 'token'] : ['token', 'anonymous']) {
          const r = await t.gql(query, {}, who === 'token' ? { token: admin } : {});
          if (who === 'token') {
            expect(r.errors).toBeUndefined();
            expect(r.data).toBeTruthy();
          } else {
            expect(r.data ?? null).toBeNull();
            expect(r.errors?.[0]?.extensions?.code).toBe('UNAUTHENTICATED');
            expect(r.errors?.[0]?.message).toMatch(/introspection .* signed-in/);
          }
        }
      }
    }
  });

  it('refuses it over plain HTTP GET too, and leaves __typename alone', async () => {
    const r = await fetch(`${url}/graphql?query=${encodeURIComponent(queries.schema)}`, {
      headers: { accept: 'application/json' },
    });
    expect(JSON.stringify(await r.json())).toContain('UNAUTHENTICATED');
    expect((await t.gql('{ __typename }')).data).toEqual({ __typename: 'Query' });
  });
});

describe('NUL bytes', () => {
  it('refuses a NUL in a path or a query string with 400, never 500', async () => {
    for (const p of [
      '/mirror/a%00/v1/f.gguf',
      '/mirror/a/v1/f%00.gguf',
      '/api/train/jobs/%00/data',
      '/api/train/data?model=a%00',
      '/graphql?query=%7B__typename%7D%00',
      '/hf/api/models/a%00/b',
      '/mirror%00',
    ]) {
      const r = await fetch(`${url}${p}`, { headers: { authorization: `Bearer ${admin}` } });
      expect([p, r.status]).toEqual([p, 400]);
      expect((await r.json()).error).toMatch(/NUL byte \(%00\) is not accepted/);
    }
  });

  it('audits a refused upload with a NUL in its name', async () => {
    const operator = await t.token('OPERATOR', 'nul-uploader');
    const r = await fetch(`${url}/mirror/nul-model/v1/bad%00name.gguf`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: 'x',
    });
    expect(r.status).toBe(400);
    const row = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'uploadToMirror', outcome: 'REFUSED' },
      orderBy: { id: 'desc' },
    });
    expect(row).toMatchObject({ target: '/mirror/nul-model/v1/bad%00name.gguf' });
    expect(row?.actor).toContain('nul-uploader');
  });

  it('refuses a NUL in a GraphQL argument, literal or variable, naming it', async () => {
    const cases: [string, Record<string, unknown>, string][] = [
      ['{ auditEvents(after: "\\u0000") { edges { node { id } } } }', {}, 'auditEvents.after'],
      ['{ trainJobs(after: "\\u0000") { edges { node { id } } } }', {}, 'trainJobs.after'],
      ['{ mirrorVersion(model: "a\\u0000", version: "v1") { model } }', {}, 'mirrorVersion.model'],
      ['query($a: String) { auditEvents(after: $a) { edges { node { id } } } }', { a: 'x\u0000' }, '$a'],
      [
        'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename } }',
        { i: { name: 'n\u0000', role: 'VIEWER' } },
        '$i.name',
      ],
    ];
    for (const [query, variables, field] of cases) {
      const r = await t.gql(query, variables, { token: admin });
      expect([field, r.errors?.[0]?.extensions]).toEqual([field, { code: 'BAD_USER_INPUT', field }]);
      expect(r.errors?.[0]?.message).toContain(`${field}: a NUL character (U+0000) is not accepted`);
    }
  });

  it('refuses a NUL in any service input, naming the field', () => {
    const r = parseInput(z.object({ name: z.string() }), { name: 'a\u0000b' });
    expect(r.ok).toBe(false);
    if (!r.ok) expect([r.error.field, r.error.message]).toEqual(['input.name', expect.stringContaining('NUL')]);
  });
});

describe('/readyz', () => {
  it('says only "database unreachable" when the database is gone, and logs the details', async () => {
    // The database behind a TCP relay that the test cuts: a PostgreSQL that went away, at a known host and port.
    const database = await freshDatabase();
    const target = new URL(database.url);
    const sockets = new Set<net.Socket>();
    const relay = net.createServer((client) => {
      const upstream = net.connect(Number(target.port), target.hostname);
      sockets.add(client).add(upstream);
      client.pipe(upstream).pipe(client);
      const drop = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', drop).on('close', drop);
      upstream.on('error', drop).on('close', drop);
    });
    await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
    const relayPort = (relay.address() as net.AddressInfo).port;
    const relayed = new URL(database.url);
    relayed.host = `127.0.0.1:${relayPort}`;
    const prisma = createPrisma(relayed.toString());
    const lines: string[] = [];
    const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-readyz-'));
    const config = loadConfig({
      HANGAR_DATA_DIR: dataDir,
      HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
      HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
      PORT: '0',
      HANGAR_WEB_DIST: path.join(dataDir, 'none'),
    });
    // LISTEN keeps the direct URL: only the queries /readyz makes go through the relay.
    const app = await createApp({
      config,
      log: createLogger('warn', (l) => lines.push(l)),
      database: { ...database, prisma, close: async () => {} },
      print: () => {},
    });
    const base = await app.start();
    try {
      expect((await fetch(`${base}/readyz`)).status).toBe(200);
      relay.close();
      for (const s of sockets) s.destroy();
      await prisma.$disconnect();
      const r = await fetch(`${base}/readyz`);
      expect(r.status).toBe(503);
      const body = (await r.json()) as { ready: boolean; reason: string };
      // Other checks may add their own words (a loop waiting for the database); none names where it is.
      expect(body).toEqual({ ready: false, reason: expect.stringMatching(/^database unreachable(; |$)/) });
      expect(body.reason).not.toMatch(
        new RegExp(`127\\.0\\.0\\.1|${relayPort}|${target.port}|can.t reach|ECONN|prisma`, 'i'),
      );
      // What the operator needs is in the log, not in the answer.
      expect(lines.join('\n')).toMatch(/not ready: the database is unreachable/);
    } finally {
      await app.stop();
      await prisma.$disconnect();
      await database.close();
      await fs.rm(dataDir, { recursive: true, force: true });
    }
  });
});

/** A raw connection to the server, to send a request as slowly as an attacker would. */
function rawSocket(base: string) {
  const { hostname, port } = new URL(base);
  const socket = net.connect(Number(port), hostname);
  let received = '';
  socket.on('data', (d) => {
    received += d.toString('latin1');
  });
  socket.on('error', () => {});
  const closed = new Promise<void>((r) => socket.on('close', () => r()));
  return { socket, closed, received: () => received };
}

/** Writes `bytes` of `fill` every `everyMs` until the socket closes (or `stopAfter` writes). */
function trickle(socket: net.Socket, fill: string, everyMs: number, stopAfter = Number.POSITIVE_INFINITY) {
  let n = 0;
  const timer = setInterval(() => {
    if (socket.destroyed || n++ >= stopAfter) return clearInterval(timer);
    socket.write(fill);
  }, everyMs);
  return () => clearInterval(timer);
}

describe('slow clients', () => {
  let s: TestApp;
  let base: string;
  let operator: string;
  beforeAll(async () => {
    s = await startTestApp({
      HANGAR_HEADERS_TIMEOUT_MS: '800',
      HANGAR_BODY_TIMEOUT_MS: '1000',
      HANGAR_UPLOAD_MIN_BYTES_PER_SECOND: '1000',
      HANGAR_UPLOAD_RATE_WINDOW_MS: '1000',
      HANGAR_LOG_LEVEL: 'error',
    });
    base = await s.app.start();
    operator = await s.token('OPERATOR', 'slow-op');
  });
  afterAll(() => s.close());

  it('closes a connection whose headers trickle in', async () => {
    const c = rawSocket(base);
    c.socket.write('GET /healthz HTTP/1.1\r\nHost: hangar\r\n');
    const stop = trickle(c.socket, 'x', 200);
    await c.closed;
    stop();
    expect(c.received()).not.toContain('200 OK');
  });

  it('cuts off a GraphQL body that trickles in, with 408', async () => {
    const c = rawSocket(base);
    c.socket.write(
      'POST /graphql HTTP/1.1\r\nHost: hangar\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{',
    );
    const stop = trickle(c.socket, ' ', 300);
    await c.closed;
    stop();
    expect(c.received()).toMatch(/^HTTP\/1\.1 408/);
    expect(c.received()).toContain('HANGAR_BODY_TIMEOUT_MS');
  });

  it('cuts off a body that trickles in after the server has already answered', async () => {
    for (const head of [
      // Over HANGAR_MAX_BODY_BYTES: refused at once, with the body still to come.
      'POST /graphql HTTP/1.1\r\nHost: hangar\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n',
      // A path that takes no body: 405 without reading it.
      'POST /audit HTTP/1.1\r\nHost: hangar\r\nContent-Length: 5000\r\n\r\n',
    ]) {
      const c = rawSocket(base);
      c.socket.write(head);
      const stop = trickle(c.socket, 'x', 300);
      await c.closed;
      stop();
      expect(c.received()).toMatch(/^HTTP\/1\.1 (413|405)/);
    }
  });

  it('cuts off an upload slower than the minimum rate, and fails nothing else', async () => {
    const c = rawSocket(base);
    c.socket.write(
      `PUT /mirror/slow/v1/trickle.bin HTTP/1.1\r\nHost: hangar\r\nAuthorization: Bearer ${operator}\r\nContent-Length: 1000000\r\n\r\n`,
    );
    const stop = trickle(c.socket, 'x'.repeat(10), 300);
    await c.closed;
    stop();
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it('lets an upload take longer than the body deadline when it keeps the rate', async () => {
    // 8 × 2000 bytes, 400 ms apart: over 3 s in all (three times HANGAR_BODY_TIMEOUT_MS), at 5000 bytes/s.
    const c = rawSocket(base);
    const chunk = 'y'.repeat(2000);
    c.socket.write(
      `PUT /mirror/steady/v1/steady.bin HTTP/1.1\r\nHost: hangar\r\nAuthorization: Bearer ${operator}\r\nContent-Length: ${chunk.length * 8}\r\nConnection: close\r\n\r\n`,
    );
    trickle(c.socket, chunk, 400, 8);
    await c.closed;
    expect(c.received()).toMatch(/^HTTP\/1\.1 201/);
    // And a download of it read slowly, past every deadline, arrives whole.
    const d = rawSocket(base);
    d.socket.write(
      `GET /mirror/steady/v1/steady.bin HTTP/1.1\r\nHost: hangar\r\nAuthorization: Bearer ${operator}\r\nConnection: close\r\n\r\n`,
    );
    d.socket.pause();
    await new Promise((r) => setTimeout(r, 2500));
    d.socket.resume();
    await d.closed;
    expect(d.received()).toMatch(/^HTTP\/1\.1 200/);
    expect(d.received().endsWith(chunk)).toBe(true);
  });

  it('keeps an SSE subscription open past the body deadline', async () => {
    const watcher = await s.token('VIEWER', 'slow-sse');
    const ctrl = new AbortController();
    const res = await fetch(`${base}/graphql`, {
      method: 'POST',
      signal: ctrl.signal,
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${watcher}` },
      body: JSON.stringify({ query: 'subscription { auditEventAdded { action target } }' }),
    });
    expect(res.headers.get('content-type')).toMatch(/text\/event-stream/);
    const reader = res.body!.getReader();
    // Three body deadlines later, an event still arrives on the same stream.
    setTimeout(() => s.token('VIEWER', 'made-later'), 3000);
    let text = '';
    while (!text.includes('made-later')) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    ctrl.abort();
    expect(text).toContain('made-later');
  });
});

describe('connection limit', () => {
  let m: TestApp;
  let base: string;
  beforeAll(async () => {
    m = await startTestApp({ HANGAR_MAX_CONNECTIONS: '2' });
    base = await m.app.start();
  });
  afterAll(() => m.close());

  it('closes connections past HANGAR_MAX_CONNECTIONS and takes new ones when some end', async () => {
    const held = [rawSocket(base), rawSocket(base)];
    await Promise.all(held.map((h) => new Promise((r) => h.socket.once('connect', r))));
    // Each holds its connection with a request that is still arriving.
    for (const h of held) h.socket.write('GET /healthz HTTP/1.1\r\nHost: hangar\r\n');
    await new Promise((r) => setTimeout(r, 200));
    const third = rawSocket(base);
    third.socket.on('connect', () => third.socket.write('GET /healthz HTTP/1.1\r\nHost: hangar\r\n\r\n'));
    await third.closed;
    expect(third.received()).toBe('');
    for (const h of held) h.socket.destroy();
    await Promise.all(held.map((h) => h.closed));
    await new Promise((r) => setTimeout(r, 200));
    const after = rawSocket(base);
    after.socket.write('GET /healthz HTTP/1.1\r\nHost: hangar\r\nConnection: close\r\n\r\n');
    await after.closed;
    expect(after.received()).toMatch(/^HTTP\/1\.1 200/);
  });
});
