import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { bytes, sha256, startUpstream, type Upstream } from '../../test/fixtures/fault-upstream.js';
import { backoffMs, retryAfterMs, sleep } from '../retry.js';
import { type ResumableOptions, resumableDownload } from './resumable.js';
import { Sha256 } from './sha256.js';

// The one resumable download, with the options its three callers set (the mirror's are in mirror/transfer.test.ts
// and test/mirror-outage.test.ts; these are the rest): verification, a partial named by content, an outage that
// counts as a try, a held file, progress and cancelling. Against a real HTTP upstream that misbehaves on request.

let up: Upstream;
let dir: string;
beforeAll(async () => {
  up = await startUpstream();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-resumable-'));
});
afterAll(async () => {
  await up.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const run = (name: string, o: Partial<ResumableOptions> = {}) =>
  resumableDownload({
    url: up.url(name),
    partialPath: path.join(dir, `${name}.part`),
    attempts: { maxAttempts: 3, backoffMs: () => 10 },
    stallMs: 1000,
    ...o,
  });

const requestsFor = (name: string) => up.requests.filter((r) => r.name === name);

describe('resumableDownload', () => {
  it('verifies the sha256 it is given, and removes a file that does not match', async () => {
    const body = bytes(50_000, 1);
    up.files.set('given.bin', { body });
    const good = await run('given.bin', { expect: { size: body.length, sha256: sha256(body) } });
    expect(good).toMatchObject({ ok: true, size: body.length, sha256: sha256(body) });

    up.files.set('wrong.bin', { body, fault: { kind: 'wrong-bytes' } });
    const bad = await run('wrong.bin', { expect: { sha256: sha256(body) } });
    expect(bad).toMatchObject({ ok: false, kind: 'mismatch', got: { wanted: sha256(body) } });
    await expect(fs.stat(path.join(dir, 'wrong.bin.part'))).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it("checks against the upstream's published sha256 with 'upstream', and refuses when there is none", async () => {
    up.files.set('nodigest.bin', { body: bytes(1000, 2), noDigest: true });
    const r = await run('nodigest.bin', { expect: { sha256: 'upstream' } });
    expect(r).toMatchObject({ ok: false, kind: 'no-digest' });
    expect(r.ok || r.reason).toMatch(/did not give the file's sha256/);
  });

  it('starts a resumed file that fails verification over once from zero (the part held an older version)', async () => {
    const body = bytes(40_000, 3);
    up.files.set('stale.bin', { body, noDigest: true });
    const partial = path.join(dir, 'stale.bin.part');
    await fs.writeFile(partial, bytes(10_000, 9)); // the head of some other file
    const r = await run('stale.bin', { expect: { sha256: sha256(body) } });
    expect(r).toMatchObject({ ok: true, sha256: sha256(body), size: body.length });
    expect(requestsFor('stale.bin').map((q) => q.range ?? null)).toEqual(['bytes=10000-', null]);
  });

  it('names the part by the published sha256, resumes one left by an earlier run, and sends If-Range', async () => {
    const body = bytes(60_000, 4);
    up.files.set('content.bin', { body });
    const cache = path.join(dir, 'by-content');
    const named = (sha: string) => path.join(cache, `${sha}.part`);
    await fs.mkdir(cache, { recursive: true });
    await fs.writeFile(named(sha256(body)), body.subarray(0, 25_000));
    const seen: number[] = [];
    const r = await run('content.bin', {
      partialPath: named,
      expect: { sha256: 'upstream' },
      onProgress: (p) => seen.push(p.bytesDone),
    });
    expect(r).toMatchObject({ ok: true, partialPath: named(sha256(body)), sha256: sha256(body) });
    expect(requestsFor('content.bin').map((q) => [q.range ?? null, q.ifRange ?? null])).toEqual([
      [null, null],
      ['bytes=25000-', `"${sha256(body)}"`],
    ]);
    expect(seen[0]).toBe(25_000);
    expect(seen.at(-1)).toBe(body.length);
  });

  it('takes a part as long as the file (416 with that length) as whole, and verifies it', async () => {
    const body = bytes(8000, 5);
    up.files.set('whole.bin', { body });
    await fs.writeFile(path.join(dir, 'whole.bin.part'), body);
    const r = await run('whole.bin', { expect: { sha256: sha256(body) } });
    expect(r).toMatchObject({ ok: true, size: body.length, sha256: sha256(body) });
    expect(requestsFor('whole.bin').map((q) => q.status)).toEqual([416]);
  });

  it('without an outage deadline, counts an unreachable upstream as a failed try and gives up', async () => {
    const url = up.url('gone.bin');
    await up.down();
    try {
      const waits: number[] = [];
      const r = await resumableDownload({
        url,
        partialPath: path.join(dir, 'gone.part'),
        attempts: {
          maxAttempts: 3,
          backoffMs: (n) => {
            waits.push(n);
            return 5;
          },
        },
        stallMs: 1000,
      });
      expect(r).toMatchObject({ ok: false, kind: 'attempts', last: expect.stringMatching(/ECONNREFUSED/) });
      expect(waits).toEqual([1, 2]);
    } finally {
      await up.up();
    }
  });

  it('writes nothing for a file beforeBody says is held, and fails with what beforeBody refuses', async () => {
    const body = bytes(30_000, 6);
    up.files.set('held.bin', { body });
    const held = await run('held.bin', { beforeBody: async (h) => (h.upstreamSha256 ? { held: true } : null) });
    expect(held).toMatchObject({ ok: true, held: true, sha256: sha256(body), size: body.length });
    expect((await fs.stat(path.join(dir, 'held.bin.part'))).size).toBe(0);

    const refused = await run('held.bin', { beforeBody: async () => ({ refuse: 'no room', keepPartial: true }) });
    expect(refused).toMatchObject({ ok: false, kind: 'refused', reason: 'no room', keepPartial: true });
  });

  it('asks for a new file without waiting on the hashing thread, which reads only a partial it resumes', async () => {
    const body = bytes(50_000, 7);
    up.files.set('fresh.bin', { body });
    // A stand-in for the hashing thread still starting (the first download in a process): it does not answer
    // addFile. A new file has no partial to read, so its download must not wait for that answer.
    const starting = vi.spyOn(Sha256.prototype, 'addFile').mockImplementation(() => new Promise(() => {}));
    try {
      const done = await run('fresh.bin', { expect: { sha256: sha256(body) } });
      expect(done).toMatchObject({ ok: true, sha256: sha256(body), size: body.length });
      expect(starting).not.toHaveBeenCalled();
    } finally {
      starting.mockRestore();
    }
    // A partial an earlier run left is read into the hash, and the download goes on from where its bytes stop.
    up.files.set('left.bin', { body });
    await fs.writeFile(path.join(dir, 'left.bin.part'), body.subarray(0, 20_000));
    const reads = vi.spyOn(Sha256.prototype, 'addFile');
    try {
      const resumed = await run('left.bin', { expect: { sha256: sha256(body) } });
      expect(resumed).toMatchObject({ ok: true, sha256: sha256(body), size: body.length });
      expect(reads).toHaveBeenCalledTimes(1);
      expect(requestsFor('left.bin').map((r) => r.range)).toEqual(['bytes=20000-']);
    } finally {
      reads.mockRestore();
    }
  }, 15_000);

  it('says what a 4xx answered, at once, with the start of its body', async () => {
    const r = await run('absent.bin');
    expect(r).toMatchObject({ ok: false, kind: 'status', status: 404 });
    expect(requestsFor('absent.bin')).toHaveLength(1);
  });

  it('stops at once when cancelled, even during a wait between tries', async () => {
    up.files.set('cut.bin', { body: bytes(20_000, 7), fault: { kind: 'status', status: 503 } });
    const stop = new AbortController();
    const p = run('cut.bin', {
      attempts: { maxAttempts: 3, giveUpAfterMs: 3_600_000, backoffMs: () => 60_000 },
      signal: stop.signal,
      onRetry: (w) => w && stop.abort(),
    });
    expect(await p).toMatchObject({ ok: false, kind: 'cancelled' });
  });
});

describe('the waits between tries', () => {
  it('doubles from the first wait up to the cap', () => {
    const wait = (n: number) => backoffMs(n - 1, { baseMs: 500, maxMs: 10_000 });
    expect([1, 2, 3, 4, 5, 6].map(wait)).toEqual([500, 1000, 2000, 4000, 8000, 10_000]);
  });

  it('reads Retry-After as seconds or a date', () => {
    expect(retryAfterMs('120')).toBe(120_000);
    expect(retryAfterMs(new Date(10_000 + 30_000).toUTCString(), 10_000)).toBe(30_000);
    expect(retryAfterMs('soon')).toBeNull();
  });

  it('ends a sleep at once on abort, with the reason', async () => {
    const stop = new AbortController();
    const slept = sleep(60_000, stop.signal);
    stop.abort(new Error('stopped'));
    await expect(slept).rejects.toThrow('stopped');
  });
});
