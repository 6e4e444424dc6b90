import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { createClient } from 'graphql-ws';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startTestApp, type TestApp } from '../../test/harness.js';

let t: TestApp;
let up: Upstream;
let token: string;
let base: string;
beforeAll(async () => {
  // Short stalls and few attempts, so the failure paths end within a test's time.
  t = await startTestApp({
    HANGAR_MIRROR_STALL_SECONDS: '1',
    HANGAR_MIRROR_ATTEMPTS: '4',
    HANGAR_MIRROR_CONCURRENCY: '4',
  });
  base = await t.app.start();
  up = await startUpstream();
  token = await t.token('OPERATOR', 'mirror-ops');
});
afterAll(async () => {
  await t.close();
  await up.close();
});
afterEach(() => {
  up.requests.length = 0;
});

// fetchAnyway: the files here are random bytes under GGUF names, which the header check before a fetch would
// refuse (registry/look.test.ts tests that check); these tests are about the download, request by request.
const FETCH = `mutation($model: String!, $version: String!, $sources: [MirrorSourceInput!]!, $force: Boolean) {
  fetchToMirror(model: $model, version: $version, sources: $sources, force: $force, fetchAnyway: true) {
    __typename
    ... on FetchStarted { message started alreadyArriving alreadyPresent version { id state } }
    ... on Error { message }
    ... on ValidationError { field }
  }
}`;

async function fetchInto(model: string, version: string, sources: Record<string, unknown>[], force = false) {
  const r = await t.gql(FETCH, { model, version, sources, force }, { token });
  return r.data?.fetchToMirror;
}

type FileView = {
  file: string;
  state: string;
  bytesDone: number;
  sha256: string | null;
  verified: boolean;
  error: string | null;
  url: string | null;
};
type VersionView = {
  state: string;
  bytesDone: number;
  bytesTotal: number | null;
  percent: number | null;
  error: string | null;
  verified: boolean;
  url: string | null;
  files: FileView[];
};

async function versionOf(model: string, version: string): Promise<VersionView | null> {
  const r = await t.gql(
    `query($m: String!, $v: String!) { mirrorVersion(model: $m, version: $v) {
      state bytesDone bytesTotal percent error verified url files { file state bytesDone sha256 verified error url } } }`,
    { m: model, v: version },
    { token },
  );
  return r.data?.mirrorVersion ?? null;
}

async function settle(model: string, version: string, timeoutMs = 20_000): Promise<VersionView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await versionOf(model, version);
    if (v && ['PRESENT', 'FAILED', 'CANCELLED'].includes(v.state)) return v;
    if (Date.now() > end) throw new Error(`${model}/${version} did not settle: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function until(check: () => boolean, timeoutMs = 10_000) {
  const end = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}

const onDisk = (model: string, version: string, file: string) =>
  `${t.dataDir}/mirror/files/${model}/${version}/${file}`;

describe('fetching', () => {
  it('fetches a set as one version, verifies every file against the published sha256, and serves it', async () => {
    const files = ['m-00001-of-00003.gguf', 'm-00002-of-00003.gguf', 'm-00003-of-00003.gguf'].map((name, i) => {
      const body = bytes(200_000 + i * 1000, i + 1);
      up.files.set(name, { body });
      return { name, body };
    });
    const started = await fetchInto(
      'qwen3-8b',
      'abc1234',
      files.map((f) => ({ url: up.url(f.name) })),
    );
    expect(started).toMatchObject({
      __typename: 'FetchStarted',
      started: 3,
      message: 'started fetching 3 files into qwen3-8b/abc1234',
    });
    expect(started.version.state).not.toBe('PRESENT');
    const v = await settle('qwen3-8b', 'abc1234');
    expect(v).toMatchObject({ state: 'PRESENT', verified: true, percent: 100, error: null });
    expect(v.bytesDone).toBe(files.reduce((n, f) => n + f.body.length, 0));
    expect(v.url).toBe(`${base}/mirror/qwen3-8b/abc1234/`);
    for (const f of files) {
      const got = await fs.readFile(onDisk('qwen3-8b', 'abc1234', f.name));
      expect(sha256(got)).toBe(sha256(f.body));
      const served = await fetch(`${base}/mirror/qwen3-8b/abc1234/${f.name}`, {
        headers: { authorization: `Bearer ${token}` },
      });
      expect(served.headers.get('etag')).toBe(`"${sha256(f.body)}"`);
      expect(sha256(Buffer.from(await served.arrayBuffer()))).toBe(sha256(f.body));
    }
    expect(await fs.readdir(`${t.dataDir}/mirror/partial`)).toEqual([]);
  });

  it('resumes with Range after the connection is reset mid-body', async () => {
    const body = bytes(300_000, 7);
    up.files.set('reset.gguf', { body, fault: { kind: 'reset', afterBytes: 100_000, times: 2 } });
    await fetchInto('reset', 'v1', [{ url: up.url('reset.gguf') }]);
    const v = await settle('reset', 'v1');
    expect(v.state).toBe('PRESENT');
    expect(v.files[0]?.sha256).toBe(sha256(body));
    const ranges = up.requests.filter((r) => r.name === 'reset.gguf').map((r) => r.range);
    expect(ranges[0]).toBeUndefined();
    expect(ranges.slice(1).every((r) => r && /^bytes=\d+-$/.test(r) && r !== 'bytes=0-')).toBe(true);
  });

  it('treats a stall as an error and resumes', async () => {
    const body = bytes(150_000, 8);
    up.files.set('stall.gguf', { body, fault: { kind: 'stall', afterBytes: 50_000 } });
    await fetchInto('stall', 'v1', [{ url: up.url('stall.gguf') }]);
    const v = await settle('stall', 'v1');
    expect(v.state).toBe('PRESENT');
    expect(v.files[0]?.sha256).toBe(sha256(body));
    expect(up.requests.filter((r) => r.name === 'stall.gguf')[1]?.range).toBe('bytes=50000-');
  });

  it('starts over from zero when the upstream ignores Range', async () => {
    const body = bytes(120_000, 9);
    // The first request is cut; the second asks for a range, and this upstream answers 200 with everything.
    up.files.set('norange.gguf', { body, fault: { kind: 'reset', afterBytes: 40_000, times: 1 } });
    const origin = up.files.get('norange.gguf')!;
    await fetchInto('norange', 'v1', [{ url: up.url('norange.gguf') }]);
    await until(() => up.requests.some((r) => r.name === 'norange.gguf'));
    origin.fault = { kind: 'ignore-range' };
    const v = await settle('norange', 'v1');
    expect(v.state).toBe('PRESENT');
    expect(v.files[0]?.sha256).toBe(sha256(body));
    const second = up.requests.filter((r) => r.name === 'norange.gguf')[1];
    expect(second).toMatchObject({ range: 'bytes=40000-', status: 200 });
  });

  it('fails a file whose bytes do not match the published sha256, and never lists or serves it', async () => {
    up.files.set('corrupt.gguf', { body: bytes(80_000, 10), fault: { kind: 'wrong-bytes' } });
    await fetchInto('corrupt', 'v1', [{ url: up.url('corrupt.gguf') }]);
    const v = await settle('corrupt', 'v1');
    expect(v.state).toBe('FAILED');
    expect(v.error).toMatch(
      /^sha256 mismatch: the upstream published [0-9a-f]{64}, the bytes hash to [0-9a-f]{64}; the download was discarded$/,
    );
    expect(v.url).toBeNull();
    expect(existsSync(onDisk('corrupt', 'v1', 'corrupt.gguf'))).toBe(false);
    expect(
      (await fetch(`${base}/mirror/corrupt/v1/corrupt.gguf`, { headers: { authorization: `Bearer ${token}` } })).status,
    ).toBe(404);
  });

  it('fails with the reason after a body that always ends short, keeping the partial for a retry', async () => {
    up.files.set('short.gguf', { body: bytes(90_000, 11), fault: { kind: 'short', bytes: 30_000 } });
    await fetchInto('short', 'v1', [{ url: up.url('short.gguf') }]);
    const v = await settle('short', 'v1', 30_000);
    expect(v.state).toBe('FAILED');
    expect(v.error).toMatch(/^gave up after 4 attempts; the last: the connection was cut at 30000 of 90000 bytes/);
    expect(v.files[0]?.bytesDone).toBe(30_000);
  }, 40_000);

  it('fails at once on a 404, saying so', async () => {
    await fetchInto('missing', 'v1', [{ url: up.url('no-such.gguf') }]);
    const v = await settle('missing', 'v1');
    expect(v.error).toBe('the upstream has no such file (HTTP 404)');
    expect(up.requests.filter((r) => r.name === 'no-such.gguf')).toHaveLength(1);
  });

  it('retries a 500 and an HTML error page, and never takes the page for the file', async () => {
    const a = bytes(50_000, 12);
    const b = bytes(50_000, 13);
    up.files.set('flaky.gguf', { body: a, fault: { kind: 'status', status: 503, times: 2 } });
    up.files.set('html.gguf', { body: b, fault: { kind: 'html', times: 1 } });
    await fetchInto('flaky', 'v1', [{ url: up.url('flaky.gguf') }, { url: up.url('html.gguf') }]);
    const v = await settle('flaky', 'v1', 30_000);
    expect(v.state).toBe('PRESENT');
    expect(v.files.map((f) => f.sha256)).toEqual([sha256(a), sha256(b)]);
  }, 40_000);

  it('starts over once when the upstream file changes under a resume (If-Range)', async () => {
    const first = bytes(100_000, 14);
    const second = bytes(110_000, 15);
    up.files.set('moving.gguf', { body: first, fault: { kind: 'reset', afterBytes: 30_000, times: 1 } });
    await fetchInto('moving', 'v1', [{ url: up.url('moving.gguf') }]);
    await until(() => up.requests.some((r) => r.name === 'moving.gguf'));
    up.files.set('moving.gguf', { body: first, fault: { kind: 'change', afterRequests: 0, next: second } });
    const v = await settle('moving', 'v1');
    expect(v.state).toBe('PRESENT');
    expect(v.files[0]?.sha256).toBe(sha256(second));
    const resumed = up.requests.filter((r) => r.name === 'moving.gguf' && r.range);
    expect(resumed[0]?.ifRange).toBe(`"${sha256(first)}"`);
  });

  it('keeps a file with no published digest as present but unverified, with its sha256 shown', async () => {
    const body = bytes(20_000, 16);
    up.files.set('plain.bin', { body, noDigest: true });
    await fetchInto('plain', 'v1', [{ url: up.url('plain.bin') }]);
    const v = await settle('plain', 'v1');
    expect(v).toMatchObject({ state: 'PRESENT', verified: false });
    expect(v.files[0]).toMatchObject({ verified: false, sha256: sha256(body) });
  });

  it('shows a byte count and no percentage when the size is unknown', async () => {
    up.files.set('nolength.bin', {
      body: bytes(60_000, 17),
      noLength: true,
      fault: { kind: 'drip', chunk: 5_000, everyMs: 200 },
    });
    await fetchInto('nolength', 'v1', [{ url: up.url('nolength.bin') }]);
    let seen: VersionView | null = null;
    for (let i = 0; i < 100 && !(seen && seen.bytesDone > 0 && seen.state === 'FETCHING'); i++) {
      seen = await versionOf('nolength', 'v1');
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(seen).toMatchObject({ state: 'FETCHING', bytesTotal: null, percent: null });
    expect(seen?.bytesDone).toBeGreaterThan(0);
    expect((await settle('nolength', 'v1')).state).toBe('PRESENT');
  });

  it('makes the same file asked for twice one transfer', async () => {
    up.files.set('twice.gguf', { body: bytes(80_000, 18), fault: { kind: 'drip', chunk: 20_000, everyMs: 50 } });
    const a = await fetchInto('twice', 'v1', [{ url: up.url('twice.gguf') }]);
    const b = await fetchInto('twice', 'v1', [{ url: up.url('twice.gguf') }]);
    expect(a.started).toBe(1);
    expect(b).toMatchObject({
      started: 0,
      alreadyArriving: 1,
      message: 'nothing new to start: 1 file(s) already arriving',
    });
    await settle('twice', 'v1');
    expect(up.requests.filter((r) => r.name === 'twice.gguf')).toHaveLength(1);
    const c = await fetchInto('twice', 'v1', [{ url: up.url('twice.gguf') }]);
    expect(c).toMatchObject({ started: 0, alreadyPresent: 1 });
  });

  it('cancels, cleans up, and retries', async () => {
    up.files.set('slow.gguf', { body: bytes(100_000, 19), fault: { kind: 'drip', chunk: 5_000, everyMs: 100 } });
    await fetchInto('slow', 'v1', [{ url: up.url('slow.gguf') }]);
    await new Promise((r) => setTimeout(r, 300));
    const c = await t.gql(
      'mutation { cancelMirrorFetch(model: "slow", version: "v1") { __typename ... on MirrorVersion { state } } }',
      {},
      { token },
    );
    expect(c.data?.cancelMirrorFetch).toEqual({ __typename: 'MirrorVersion', state: 'CANCELLED' });
    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'slow' } });
    await until(() => !existsSync(`${t.dataDir}/mirror/partial/${row.id}.part`));
    expect(row).toMatchObject({ state: 'CANCELLED', bytesDone: 0n });
    up.files.get('slow.gguf')!.fault = { kind: 'none' };
    const r = await t.gql(
      'mutation { retryMirrorFetch(model: "slow", version: "v1") { __typename ... on MirrorVersion { state } } }',
      {},
      { token },
    );
    expect(r.data?.retryMirrorFetch.__typename).toBe('MirrorVersion');
    expect((await settle('slow', 'v1')).state).toBe('PRESENT');
  });

  it('refuses a set larger than the free disk, with both numbers, and starts nothing', async () => {
    const r = await fetchInto('huge', 'v1', [{ url: up.url('huge.gguf'), size: 2 ** 52 }]);
    expect(r.__typename).toBe('ConflictError');
    expect(r.message).toMatch(/^not enough disk for huge\/v1: it needs 4503599627370496 bytes and \d+ are free under /);
    expect(await versionOf('huge', 'v1')).toBeNull();
  });

  it('names the bad field and changes nothing', async () => {
    const bad = await fetchInto('../etc', 'v1', [{ url: up.url('x') }]);
    expect(bad).toMatchObject({ __typename: 'ValidationError', field: 'model' });
    expect(bad.message).toMatch(/letters, digits/);
    const badUrl = await fetchInto('ok', 'v1', [{ url: 'ftp://example.com/x.gguf' }]);
    expect(badUrl).toMatchObject({ __typename: 'ValidationError', field: 'sources.0.url' });
    const badSha = await fetchInto('ok', 'v1', [{ url: up.url('x.gguf'), sha256: 'abc' }]);
    expect(badSha).toMatchObject({ __typename: 'ValidationError', field: 'sources.0.sha256' });
    expect(await versionOf('ok', 'v1')).toBeNull();
  });

  it('resumes every unfinished file after a restart, from its offset', async () => {
    const body = bytes(400_000, 20);
    up.files.set('restart.gguf', { body, fault: { kind: 'drip', chunk: 10_000, everyMs: 100 } });
    await fetchInto('restart', 'v1', [{ url: up.url('restart.gguf'), sha256: sha256(body) }]);
    let v = await versionOf('restart', 'v1');
    while (!v || v.bytesDone < 60_000) {
      await new Promise((r) => setTimeout(r, 50));
      v = await versionOf('restart', 'v1');
    }
    await t.restart();
    base = await t.app.start();
    const done = await settle('restart', 'v1');
    expect(done).toMatchObject({ state: 'PRESENT', verified: true });
    const resumed = up.requests.filter((r) => r.name === 'restart.gguf').at(-1);
    expect(Number(resumed?.range?.match(/bytes=(\d+)-/)?.[1]), JSON.stringify(up.requests)).toBeGreaterThanOrEqual(
      60_000,
    );
  });
});

describe('live progress', () => {
  it('streams whole versions over mirrorChanged, bytes only going up, ending present', async () => {
    const body = bytes(200_000, 31);
    up.files.set('live.gguf', { body, fault: { kind: 'drip', chunk: 20_000, everyMs: 150 } });
    const client = createClient({
      url: `${base.replace('http', 'ws')}/graphql`,
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${token}` },
    });
    type Event = { mirrorChanged: { id: string; state: string; bytesDone: number; percent: number | null } };
    const seen: Event['mirrorChanged'][] = [];
    const done = new Promise<void>((resolve, reject) => {
      client.subscribe<Event>(
        { query: 'subscription { mirrorChanged { id state bytesDone percent } }' },
        {
          next: (e) => {
            const v = e.data?.mirrorChanged;
            if (v?.id !== 'live/v1') return;
            seen.push(v);
            if (v.state === 'PRESENT') resolve();
          },
          error: reject,
          complete: () => {},
        },
      );
    });
    await new Promise((r) => setTimeout(r, 200));
    await fetchInto('live', 'v1', [{ url: up.url('live.gguf'), sha256: sha256(body) }]);
    await done;
    await client.dispose();
    const progress = seen.filter((e) => e.state === 'FETCHING').map((e) => e.bytesDone);
    expect(progress.length).toBeGreaterThanOrEqual(1);
    expect([...progress].sort((a, b) => a - b)).toEqual(progress);
    expect(seen.at(-1)).toEqual({ id: 'live/v1', state: 'PRESENT', bytesDone: 200_000, percent: 100 });
  });
});

describe('listing and removing', () => {
  it('groups versions into families, arriving first, and counts versions', async () => {
    const r = await t.gql(
      '{ mirror { fetching present failed families { name modelCount versions { model version state } } } }',
      {},
      { token },
    );
    const m = r.data?.mirror;
    const names = m.families.map((f: { name: string }) => f.name);
    expect(names).toContain('qwen');
    expect(new Set(names).size).toBe(names.length);
    const states = m.families.flatMap((f: { versions: { state: string }[] }) => f.versions.map((v) => v.state));
    expect(m.present).toBe(states.filter((s: string) => s === 'PRESENT').length);
    expect(m.failed).toBe(states.filter((s: string) => s === 'FAILED').length);
  });

  it('removes a version, its files and its rows, and audits how many', async () => {
    const r = await t.gql(
      'mutation { removeMirrorVersion(model: "qwen3-8b", version: "abc1234") { __typename ... on RemovedMirrorVersion { files bytes } } }',
      {},
      { token },
    );
    expect(r.data?.removeMirrorVersion).toMatchObject({ __typename: 'RemovedMirrorVersion', files: 3 });
    expect(existsSync(`${t.dataDir}/mirror/files/qwen3-8b/abc1234`)).toBe(false);
    expect(
      (
        await fetch(`${base}/mirror/qwen3-8b/abc1234/m-00001-of-00003.gguf`, {
          headers: { authorization: `Bearer ${token}` },
        })
      ).status,
    ).toBe(404);
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'removeMirrorVersion' },
      orderBy: { id: 'desc' },
    });
    expect(audit?.message).toMatch(/^removed 3 file\(s\), \d+ bytes$/);
  });

  it('refuses to remove a version a catalog model uses, unless forced', async () => {
    await t.app.db.prisma.catalogModel.create({
      data: { name: 'plain-model', source: `${base}/mirror/plain/v1/plain.bin`, engine: 'llamacpp' },
    });
    const r = await t.gql(
      'mutation { removeMirrorVersion(model: "plain", version: "v1") { __typename ... on Error { message } } }',
      {},
      { token },
    );
    expect(r.data?.removeMirrorVersion.__typename).toBe('ConflictError');
    expect(r.data?.removeMirrorVersion.message).toMatch(/is the source of plain-model/);
    const used = await t.gql(
      '{ mirrorVersion(model: "plain", version: "v1") { usedBy { name mode } } }',
      {},
      { token },
    );
    expect(used.data?.mirrorVersion.usedBy).toEqual([{ name: 'plain-model', mode: 'ALWAYS' }]);
    const forced = await t.gql(
      'mutation { removeMirrorVersion(model: "plain", version: "v1", force: true) { __typename } }',
      {},
      { token },
    );
    expect(forced.data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
  });

  it('refuses a viewer', async () => {
    const viewer = await t.token('VIEWER', 'mirror-viewer');
    const r = await t.gql(
      'mutation { removeMirrorVersion(model: "reset", version: "v1") { __typename } }',
      {},
      { token: viewer },
    );
    expect(r.data?.removeMirrorVersion.__typename).toBe('ForbiddenError');
    expect(await versionOf('reset', 'v1')).not.toBeNull();
  });
});
