import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startLoopbackProxy } from '../../test/fixtures/loopback-proxy.js';
import { guardedFetch, OutboundPolicy } from '../outbound.js';
import { type GetResponse, httpGet } from './http-get.js';

// Downloads and the registry's Hub requests through a real proxy on loopback (HTTPS_PROXY / HTTP_PROXY /
// NO_PROXY, lower-case too), against real HTTP and TLS upstreams.

const TOKEN = 'hf_SecretHubTokenNeverForTheProxy';
const tls = path.join(import.meta.dirname, '../../test/fixtures/tls');
const cert = fs.readFileSync(path.join(tls, 'localhost.crt'), 'utf8');
const key = fs.readFileSync(path.join(tls, 'localhost.key'), 'utf8');
const body = Buffer.alloc(3 << 20, 7);
const heard: { authorization?: string; url?: string }[] = [];

const serve = (req: http.IncomingMessage, res: http.ServerResponse) => {
  heard.push({ authorization: req.headers.authorization, url: req.url });
  res.writeHead(200, { 'content-length': body.length, 'content-type': 'application/octet-stream' }).end(body);
};

let proxy: Awaited<ReturnType<typeof startLoopbackProxy>>;
let tlsPort = 0;
let plainPort = 0;
const servers: http.Server[] = [];
const VARS = [
  'HTTPS_PROXY',
  'https_proxy',
  'HTTP_PROXY',
  'http_proxy',
  'NO_PROXY',
  'no_proxy',
  'ALL_PROXY',
  'all_proxy',
];
const saved = Object.fromEntries(VARS.map((v) => [v, process.env[v]]));

async function listen(server: http.Server) {
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return (server.address() as AddressInfo).port;
}

async function read(res: GetResponse) {
  const parts: Buffer[] = [];
  await res.readBody(async (block) => {
    parts.push(Buffer.from(block));
  });
  return Buffer.concat(parts);
}

const signal = () => AbortSignal.timeout(10_000);

beforeAll(async () => {
  proxy = await startLoopbackProxy();
  tlsPort = await listen(https.createServer({ cert, key }, serve));
  plainPort = await listen(http.createServer(serve));
});
afterEach(() => {
  for (const v of VARS) {
    if (saved[v] === undefined) delete process.env[v];
    else process.env[v] = saved[v];
  }
  proxy.reset();
  heard.length = 0;
});
afterAll(async () => {
  await proxy.close();
  for (const s of servers) s.closeAllConnections?.();
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
});

describe('downloads through a proxy', () => {
  it('tunnels an https download through https_proxy (lower-case): the proxy sees the host, never the token', async () => {
    process.env.https_proxy = proxy.url;
    process.env.HTTPS_PROXY = 'http://127.0.0.1:9'; // the lower-case name wins, as in curl
    const url = `https://localhost:${tlsPort}/acme/m/resolve/main/w.bin`;
    const res = await httpGet(url, { headers: { authorization: `Bearer ${TOKEN}` }, signal: signal(), ca: cert });
    expect(res.status).toBe(200);
    expect((await read(res)).equals(body)).toBe(true);
    expect(proxy.seen).toEqual([expect.objectContaining({ method: 'CONNECT', target: `localhost:${tlsPort}` })]);
    expect(JSON.stringify(proxy.seen)).not.toContain(TOKEN);
    const inside = proxy.tunnelled();
    expect(inside.length).toBeGreaterThan(0);
    expect(inside.includes(TOKEN)).toBe(false); // TLS inside the tunnel: the token is never in the clear there
    expect(heard).toEqual([{ authorization: `Bearer ${TOKEN}`, url: '/acme/m/resolve/main/w.bin' }]);
  });

  it('sends an http download to HTTP_PROXY in absolute form, with the proxy credentials from its URL', async () => {
    const u = new URL(proxy.url);
    process.env.HTTP_PROXY = `http://ops:s%40cret@${u.host}`;
    const url = `http://127.0.0.1:${plainPort}/f?x=1`;
    const res = await httpGet(url, { headers: {}, signal: signal() });
    expect((await read(res)).equals(body)).toBe(true);
    expect(proxy.seen).toEqual([expect.objectContaining({ method: 'GET', target: url })]);
    expect(proxy.seen[0]?.headers['proxy-authorization']).toBe(`Basic ${Buffer.from('ops:s@cret').toString('base64')}`);
    expect(heard).toEqual([{ authorization: undefined, url: '/f?x=1' }]);
  });

  it('goes direct to a host NO_PROXY names', async () => {
    process.env.HTTPS_PROXY = proxy.url;
    process.env.HTTP_PROXY = proxy.url;
    process.env.no_proxy = 'example.org, localhost';
    const res = await httpGet(`https://localhost:${tlsPort}/f`, { headers: {}, signal: signal(), ca: cert });
    expect((await read(res)).equals(body)).toBe(true);
    const plain = await httpGet(`http://127.0.0.1:${plainPort}/f`, { headers: {}, signal: signal() });
    expect((await read(plain)).equals(body)).toBe(true);
    // localhost went direct; 127.0.0.1 is not named, so it went through the proxy.
    expect(proxy.seen.map((s) => s.method)).toEqual(['GET']);
  });

  it('still refuses a private target through the proxy, while the proxy on loopback is allowed', async () => {
    process.env.HTTPS_PROXY = proxy.url;
    // internal.example resolves (here) to a private address: the proxy would reach it, so it is refused first.
    const resolve = async (name: string) =>
      name === 'internal.example' ? [{ address: '10.0.0.5', family: 4 }] : [{ address: '127.0.0.1', family: 4 }];
    const guard = new OutboundPolicy({ allow: ['localhost'], hubUrl: null, resolve });
    await expect(
      httpGet('https://internal.example/secrets', { headers: {}, signal: signal(), guard }),
    ).rejects.toMatchObject({
      code: 'EOUTBOUND',
      message: expect.stringMatching(/internal\.example \(at 10\.0\.0\.5\) is a private address/),
    });
    await expect(httpGet('https://10.1.2.3/x', { headers: {}, signal: signal(), guard })).rejects.toMatchObject({
      code: 'EOUTBOUND',
    });
    expect(proxy.seen).toEqual([]);
    // A listed host goes through, although the proxy itself is on a loopback address the policy does not list.
    const res = await httpGet(`https://localhost:${tlsPort}/f`, { headers: {}, signal: signal(), guard, ca: cert });
    expect((await read(res)).equals(body)).toBe(true);
    expect(proxy.seen.map((s) => s.method)).toEqual(['CONNECT']);
  });

  it('says which proxy could not be reached', async () => {
    process.env.HTTPS_PROXY = 'http://127.0.0.1:9';
    await expect(httpGet(`https://localhost:${tlsPort}/f`, { headers: {}, signal: signal() })).rejects.toMatchObject({
      code: 'ECONNREFUSED',
      message: expect.stringContaining('could not reach the proxy 127.0.0.1:9'),
    });
  });
});

describe("the registry's Hub requests through a proxy (guardedFetch)", () => {
  it('tunnels to the Hub with the token inside TLS, and honours NO_PROXY', async () => {
    process.env.HTTPS_PROXY = proxy.url;
    const hubUrl = `https://localhost:${tlsPort}`;
    const hubFetch = guardedFetch(new OutboundPolicy({ allow: [], hubUrl }), undefined, { ca: cert });
    const res = await hubFetch(`${hubUrl}/api/models/acme/m`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(body)).toBe(true);
    expect(proxy.seen).toEqual([expect.objectContaining({ method: 'CONNECT', target: `localhost:${tlsPort}` })]);
    expect(JSON.stringify(proxy.seen)).not.toContain(TOKEN);
    expect(proxy.tunnelled().includes(TOKEN)).toBe(false);
    expect(heard).toEqual([{ authorization: `Bearer ${TOKEN}`, url: '/api/models/acme/m' }]);

    proxy.reset();
    process.env.NO_PROXY = 'localhost';
    const direct = guardedFetch(new OutboundPolicy({ allow: [], hubUrl: `http://localhost:${plainPort}` }));
    expect((await direct(`http://localhost:${plainPort}/api/models/acme/m`)).status).toBe(200);
    expect(proxy.seen).toEqual([]);
  });

  it('refuses a private hop through the proxy before the proxy hears of it', async () => {
    process.env.HTTPS_PROXY = proxy.url;
    const hubFetch = guardedFetch(new OutboundPolicy({ allow: [], hubUrl: 'https://huggingface.co' }));
    await expect(hubFetch('https://10.0.0.7/api/models/x')).rejects.toThrow(/10\.0\.0\.7 is a private address/);
    expect(proxy.seen).toEqual([]);
  });
});
