import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { startLoopbackProxy } from '@hangar/common/test/fixtures/loopback-proxy';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Bandwidth, SLICE } from './bandwidth.js';
import { transfer } from './transfer.js';

let up: Upstream;
let dir: string;
beforeAll(async () => {
  up = await startUpstream();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-transfer-'));
});
afterAll(async () => {
  await up.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const run = (name: string, partial: string, extra: Partial<Parameters<typeof transfer>[0]> = {}) =>
  transfer({
    url: up.url(name),
    partialPath: partial,
    stallMs: 1000,
    maxAttempts: 3,
    signal: new AbortController().signal,
    onProgress: () => {},
    reserveSpace: async () => null,
    backoffMs: () => 10,
    ...extra,
  });

describe('one transfer', () => {
  it('starts over once when a resume is refused with 416 (the upstream file shrank)', async () => {
    const body = bytes(10_000, 3);
    up.files.set('shrunk.bin', { body });
    const partial = path.join(dir, 'shrunk.part');
    await fs.writeFile(partial, bytes(20_000, 4)); // a partial longer than the file now is
    const r = await run('shrunk.bin', partial);
    expect(r).toMatchObject({ ok: true, size: 10_000, sha256: sha256(body) });
    expect(up.requests.filter((q) => q.name === 'shrunk.bin').map((q) => q.status)).toEqual([416, 200]);
  });

  it('never takes an empty body for the file', async () => {
    up.files.set('empty.bin', { body: Buffer.alloc(0) });
    const r = await run('empty.bin', path.join(dir, 'empty.part'));
    expect(r).toEqual({
      ok: false,
      reason: 'gave up after 3 attempts; the last: the upstream sent an empty body',
      keepPartial: true,
    });
  });

  it('stops at once when the disk cannot hold what is still to come, keeping the partial', async () => {
    up.files.set('big.bin', { body: bytes(50_000, 5) });
    const r = await run('big.bin', path.join(dir, 'big.part'), {
      reserveSpace: async (n) => `not enough disk: ${n} bytes still to come, 1000 free`,
    });
    expect(r).toEqual({
      ok: false,
      reason: 'not enough disk: 50000 bytes still to come, 1000 free',
      keepPartial: true,
    });
    expect(up.requests.filter((q) => q.name === 'big.bin')).toHaveLength(1);
  });

  it('with fsync, flushes the file and still gives the right digest', async () => {
    const body = bytes(300_000, 12);
    up.files.set('durable.bin', { body });
    const r = await run('durable.bin', path.join(dir, 'durable.part'), { fsync: true });
    expect(r).toMatchObject({ ok: true, size: 300_000, sha256: sha256(body) });
    expect(await fs.readFile(path.join(dir, 'durable.part'))).toEqual(body);
  });

  it('refuses a file larger than announced', async () => {
    up.files.set('larger.bin', { body: bytes(5_000, 6) });
    const r = await run('larger.bin', path.join(dir, 'larger.part'), { expectedSize: 4_000 });
    expect(r).toEqual({
      ok: false,
      reason: 'the upstream says the file is 5000 bytes; 4000 were expected',
      keepPartial: false,
    });
  });
});

describe('redirects', () => {
  /** A server that answers every path with a redirect to `to(path)`, and records what it was sent. */
  async function redirector(to: (p: string) => string) {
    const seen: { path: string; auth: string | null }[] = [];
    const server = http.createServer((req, res) => {
      seen.push({ path: req.url ?? '', auth: req.headers.authorization ?? null });
      res.writeHead(302, { location: to(req.url ?? '/') }).end();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return { url, seen, close: () => new Promise<void>((r) => server.close(() => r())) };
  }

  it("follows the Hub's redirect to its CDN, and sends the token only to the origin it was meant for", async () => {
    const body = bytes(50_000, 11);
    up.files.set('cdn.bin', { body });
    const hub = await redirector(() => up.url('cdn.bin'));
    try {
      const r = await transfer({
        url: `${hub.url}/acme/model/resolve/main/cdn.bin`,
        partialPath: path.join(dir, 'cdn.part'),
        headers: { authorization: 'Bearer hf_secret' },
        stallMs: 1000,
        maxAttempts: 1,
        signal: new AbortController().signal,
        onProgress: () => {},
        reserveSpace: async () => null,
      });
      expect(r).toMatchObject({ ok: true, size: 50_000, sha256: sha256(body) });
      expect(hub.seen).toEqual([{ path: '/acme/model/resolve/main/cdn.bin', auth: 'Bearer hf_secret' }]);
      const atCdn = up.requests.filter((q) => q.name === 'cdn.bin');
      expect(atCdn.map((q) => q.authorization ?? null)).toEqual([null]);
    } finally {
      await hub.close();
    }
  });

  it('gives up on a redirect loop with the reason', async () => {
    const loop = await redirector((p) => `${p}x`);
    try {
      const r = await transfer({
        url: `${loop.url}/a`,
        partialPath: path.join(dir, 'loop.part'),
        stallMs: 1000,
        maxAttempts: 1,
        signal: new AbortController().signal,
        onProgress: () => {},
        reserveSpace: async () => null,
      });
      expect(r).toMatchObject({ ok: false });
      expect((r as { reason: string }).reason).toMatch(/redirected more than 10 times/);
      expect(loop.seen).toHaveLength(11);
    } finally {
      await loop.close();
    }
  });
});

describe('riding out outages', () => {
  it('goes on past maxAttempts while each attempt moves bytes: progress starts the count again', async () => {
    const body = bytes(100_000, 21);
    // Five cuts in a row, each after 15 000 more bytes: with two attempts counted from the start it would fail.
    up.files.set('flaky-link.bin', { body, fault: { kind: 'reset', afterBytes: 15_000, times: 5 } });
    const r = await run('flaky-link.bin', path.join(dir, 'flaky-link.part'), { maxAttempts: 2 });
    expect(r).toMatchObject({ ok: true, size: 100_000, sha256: sha256(body) });
    expect(up.requests.filter((q) => q.name === 'flaky-link.bin')).toHaveLength(6);
  });

  it('retries an unreachable upstream past maxAttempts, says so while it waits, and resumes once it is back', async () => {
    const down = await startUpstream();
    const body = bytes(80_000, 22);
    down.files.set('back.bin', { body });
    await down.down();
    const retries: { attempt: number; reason: string }[] = [];
    const running = transfer({
      url: down.url('back.bin'),
      partialPath: path.join(dir, 'back.part'),
      stallMs: 1000,
      maxAttempts: 2,
      giveUpAfterMs: 30_000,
      retryMaxMs: 50,
      signal: new AbortController().signal,
      onProgress: () => {},
      onRetry: (w) => {
        if (w) retries.push({ attempt: w.attempt, reason: w.reason });
      },
      reserveSpace: async () => null,
    });
    while (retries.length < 6) await new Promise((res) => setTimeout(res, 20));
    await down.up();
    try {
      expect(await running).toMatchObject({ ok: true, size: 80_000, sha256: sha256(body) });
      expect(retries.slice(0, 3)).toEqual(
        [2, 3, 4].map((attempt) => ({
          attempt,
          reason: 'could not reach the upstream (ECONNREFUSED)',
        })),
      );
    } finally {
      await down.close();
    }
  });

  it('gives up on an unreachable upstream once the deadline passes, keeping the partial', async () => {
    const gone = await startUpstream();
    await gone.down();
    const started = Date.now();
    const r = await transfer({
      url: gone.url('never.bin'),
      partialPath: path.join(dir, 'never.part'),
      stallMs: 1000,
      maxAttempts: 1,
      giveUpAfterMs: 1000,
      retryMaxMs: 100,
      signal: new AbortController().signal,
      onProgress: () => {},
      reserveSpace: async () => null,
    });
    expect(r).toEqual({
      ok: false,
      reason:
        'gave up: no byte arrived for 1 s (HANGAR_MIRROR_GIVE_UP_AFTER); the last: could not reach the upstream (ECONNREFUSED); retry continues from the partial',
      keepPartial: true,
    });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
  });

  it('fails at once on an answer that will not change, with its reason', async () => {
    up.files.set('gated.bin', {
      body: bytes(1000, 23),
      fault: {
        kind: 'status',
        status: 403,
        times: 99,
        headers: { 'x-error-message': 'Access to model acme/x is restricted' },
      },
    });
    const r = await run('gated.bin', path.join(dir, 'gated.part'), { giveUpAfterMs: 60_000 });
    expect(r).toEqual({
      ok: false,
      reason:
        'the upstream refused access (HTTP 403: Access to model acme/x is restricted): a gated repository needs HANGAR_HUB_TOKEN',
      keepPartial: false,
    });
    const missing = await run('no-such.bin', path.join(dir, 'no-such.part'), { giveUpAfterMs: 60_000 });
    expect(missing).toMatchObject({ ok: false, reason: 'the upstream has no such file (HTTP 404)' });
    expect(up.requests.filter((q) => q.name === 'gated.bin' || q.name === 'no-such.bin')).toHaveLength(2);
  });

  it("waits as long as a 503's Retry-After asks, beyond the backoff", async () => {
    const body = bytes(5000, 24);
    up.files.set('busy.bin', {
      body,
      fault: { kind: 'status', status: 503, times: 1, headers: { 'retry-after': '1' } },
    });
    const started = Date.now();
    const r = await run('busy.bin', path.join(dir, 'busy.part'), { giveUpAfterMs: 60_000 });
    expect(r).toMatchObject({ ok: true, sha256: sha256(body) });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
  });
});

describe('the bandwidth limit', () => {
  it('holds a download to the limit: 2 MB at 1 MB/s takes at least 1.5 s', async () => {
    const body = bytes(2_000_000, 25);
    up.files.set('limited.bin', { body });
    const limit = new Bandwidth(1_000_000);
    const started = Date.now();
    const r = await run('limited.bin', path.join(dir, 'limited.part'), {
      throttle: { slice: () => SLICE, take: (n, signal) => limit.take(n, signal) },
    });
    expect(r).toMatchObject({ ok: true, size: 2_000_000, sha256: sha256(body) });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1500);
  });
});

describe('through a proxy', () => {
  it('fetches and resumes through HTTP_PROXY, and goes direct for a host in NO_PROXY', async () => {
    const proxy = await startLoopbackProxy();
    const saved = { http: process.env.HTTP_PROXY, no: process.env.NO_PROXY };
    try {
      process.env.HTTP_PROXY = proxy.url;
      const body = bytes(300_000, 26);
      up.files.set('proxied.bin', { body, fault: { kind: 'reset', afterBytes: 100_000, times: 1 } });
      const r = await run('proxied.bin', path.join(dir, 'proxied.part'));
      expect(r).toMatchObject({ ok: true, size: body.length, sha256: sha256(body) });
      expect(proxy.seen.map((q) => [q.method, q.target, q.headers.range ?? null])).toEqual([
        ['GET', up.url('proxied.bin'), null],
        ['GET', up.url('proxied.bin'), expect.stringMatching(/^bytes=\d+-$/)],
      ]);

      proxy.reset();
      process.env.NO_PROXY = new URL(up.url('x')).hostname;
      up.files.set('direct.bin', { body: bytes(5000, 27) });
      expect(await run('direct.bin', path.join(dir, 'direct.part'))).toMatchObject({ ok: true });
      expect(proxy.seen).toEqual([]);
    } finally {
      for (const [k, v] of [
        ['HTTP_PROXY', saved.http],
        ['NO_PROXY', saved.no],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      await proxy.close();
    }
  });
});
