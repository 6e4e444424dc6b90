import fs from 'node:fs/promises';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from './harness.js';

// The mirror left alone through an upstream outage, paused and resumed by an operator, and holding the same
// bytes once. The outage runs on the same code path as a real one of hours: only the deadline and the backoff's
// cap are short here (HANGAR_MIRROR_GIVE_UP_AFTER, HANGAR_MIRROR_RETRY_MAX), and two counted attempts would have
// failed it long before the upstream came back.

let t: TestApp;
let up: Upstream;
let token: string;
beforeAll(async () => {
  t = await startTestApp({
    HANGAR_MIRROR_ATTEMPTS: '2',
    HANGAR_MIRROR_GIVE_UP_AFTER: '2m',
    HANGAR_MIRROR_RETRY_MAX: '400ms',
    HANGAR_MIRROR_STALL_SECONDS: '2',
  });
  await t.app.start();
  up = await startUpstream();
  token = await t.token('OPERATOR', 'outage-ops');
});
afterAll(async () => {
  await t.close();
  await up.close();
});

const FETCH = `mutation($model: String!, $version: String!, $sources: [MirrorSourceInput!]!) {
  fetchToMirror(model: $model, version: $version, sources: $sources) { __typename ... on Error { message } }
}`;

type Retry = { attempt: number; nextAt: string; reason: string } | null;
type Version = {
  state: string;
  bytesDone: number;
  bytesPerSecond: number | null;
  etaSeconds: number | null;
  retry: Retry;
  files: { id: string; state: string; sha256: string | null; bytesDone: number; retry: Retry }[];
};

async function fetchInto(model: string, version: string, sources: Record<string, unknown>[]) {
  const r = await t.gql(FETCH, { model, version, sources }, { token });
  expect(r.data?.fetchToMirror.__typename, JSON.stringify(r.data)).toBe('FetchStarted');
}

async function versionOf(model: string, version: string): Promise<Version> {
  const r = await t.gql(
    `query($m: String!, $v: String!) { mirrorVersion(model: $m, version: $v) {
      state bytesDone bytesPerSecond etaSeconds retry { attempt nextAt reason }
      files { id state sha256 bytesDone retry { attempt nextAt reason } } } }`,
    { m: model, v: version },
    { token },
  );
  return r.data?.mirrorVersion;
}

async function until<T>(what: string, get: () => Promise<T>, ok: (v: T) => boolean, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await get();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`${what}: still ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const mutate = async (name: string, model: string, version: string) =>
  (
    await t.gql(
      `mutation($m: String!, $v: String!) { ${name}(model: $m, version: $v) { __typename ... on MirrorVersion { state } ... on Error { message } } }`,
      { m: model, v: version },
      { token },
    )
  ).data?.[name];

const disk = async () =>
  Number((await t.gql('{ mirror { diskUsedBytes } }', {}, { token })).data?.mirror.diskUsedBytes);

describe('an upstream that goes away', () => {
  it('rides out the outage unattended, showing the retries while it waits, and resumes from where it stopped', async () => {
    const body = bytes(600_000, 41);
    up.files.set('outage.bin', { body, fault: { kind: 'drip', chunk: 20_000, everyMs: 50 } });
    await fetchInto('outage', 'v1', [{ url: up.url('outage.bin'), sha256: sha256(body) }]);
    await until(
      'some bytes',
      () => versionOf('outage', 'v1'),
      (v) => v?.bytesDone >= 100_000,
    );
    await up.down();
    const downAt = Date.now();

    // While it is down: the truth, live. Several tries already (more than HANGAR_MIRROR_ATTEMPTS), a rate of
    // zero, no ETA, and what the last try met.
    const waiting = await until(
      'retrying',
      () => versionOf('outage', 'v1'),
      (v) => (v.retry?.attempt ?? 0) >= 4,
    );
    expect(waiting).toMatchObject({ state: 'FETCHING', bytesPerSecond: 0, etaSeconds: null });
    expect(waiting.retry?.reason).toBe('could not reach the upstream (ECONNREFUSED)');
    expect(waiting.files[0]?.retry?.attempt).toBe(waiting.retry?.attempt);
    expect(Date.parse(waiting.retry?.nextAt ?? '')).toBeGreaterThan(Date.now() - 1000);
    const before = waiting.bytesDone;
    // Down for a while longer: many more tries than two counted attempts would allow.
    while (Date.now() - downAt < 4000) await new Promise((r) => setTimeout(r, 100));
    expect((await versionOf('outage', 'v1')).state).toBe('FETCHING');

    up.requests.length = 0;
    await up.up();
    const done = await until(
      'settled',
      () => versionOf('outage', 'v1'),
      (v) => ['PRESENT', 'FAILED'].includes(v.state),
    );
    expect(done).toMatchObject({ state: 'PRESENT', retry: null });
    expect(done.files[0]?.sha256).toBe(sha256(body));
    // Resumed from the partial, not started again.
    const resumed = up.requests.find((r) => r.name === 'outage.bin');
    expect(Number(resumed?.range?.match(/^bytes=(\d+)-$/)?.[1])).toBeGreaterThanOrEqual(before);
  }, 60_000);
});

describe('pause and resume', () => {
  it('stops the download keeping its partial, leases nothing while paused, and resumes with a Range', async () => {
    const body = bytes(400_000, 42);
    up.files.set('pausable.bin', { body, fault: { kind: 'drip', chunk: 20_000, everyMs: 100 } });
    await fetchInto('pausable', 'v1', [{ url: up.url('pausable.bin'), sha256: sha256(body) }]);
    await until(
      'some bytes',
      () => versionOf('pausable', 'v1'),
      (v) => v?.bytesDone >= 60_000,
    );
    expect(await mutate('pauseMirrorFetch', 'pausable', 'v1')).toEqual({
      __typename: 'MirrorVersion',
      state: 'PAUSED',
    });

    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'pausable' } });
    const partial = `${t.dataDir}/mirror/partial/${row.id}.part`;
    // The bytes that arrived stay, and the row says how many once the transfer has stopped.
    const paused = await until(
      'bytes recorded',
      () => versionOf('pausable', 'v1'),
      (v) => v.bytesDone > 0 && v.state === 'PAUSED',
    );
    await new Promise((r) => setTimeout(r, 2500)); // a poll of the queue or two
    const requests = up.requests.filter((r) => r.name === 'pausable.bin').length;
    const size = (await fs.stat(partial)).size;
    expect(size).toBeGreaterThanOrEqual(60_000);
    const still = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'pausable' } });
    expect(still).toMatchObject({ state: 'PAUSED', leaseOwner: null, bytesDone: BigInt(size) });
    expect(paused.bytesPerSecond).toBeNull();
    expect(await mutate('pauseMirrorFetch', 'pausable', 'v1')).toMatchObject({ __typename: 'ConflictError' });

    expect(await mutate('resumeMirrorFetch', 'pausable', 'v1')).toMatchObject({ __typename: 'MirrorVersion' });
    const done = await until(
      'present',
      () => versionOf('pausable', 'v1'),
      (v) => v.state === 'PRESENT',
    );
    expect(done.files[0]?.sha256).toBe(sha256(body));
    const after = up.requests.filter((r) => r.name === 'pausable.bin');
    expect(after.length).toBe(requests + 1);
    expect(after.at(-1)?.range).toBe(`bytes=${size}-`);
    const audit = await t.app.db.prisma.auditEvent.findMany({
      where: { target: 'pausable/v1', action: { in: ['pauseMirrorFetch', 'resumeMirrorFetch'] } },
      orderBy: { id: 'asc' },
    });
    expect(audit.map((a) => [a.action, a.outcome])).toEqual([
      ['pauseMirrorFetch', 'DONE'],
      ['pauseMirrorFetch', 'REFUSED'],
      ['resumeMirrorFetch', 'DONE'],
    ]);
  }, 30_000);
});

describe('the same bytes once', () => {
  it('links a file whose sha256 the mirror holds instead of downloading it, and counts its bytes once', async () => {
    const body = bytes(300_000, 43);
    up.files.set('shared-a.bin', { body });
    up.files.set('shared-b.bin', { body });
    up.files.set('shared-c.bin', { body });
    await fetchInto('shared-a', 'v1', [{ url: up.url('shared-a.bin'), sha256: sha256(body) }]);
    await until(
      'present',
      () => versionOf('shared-a', 'v1'),
      (v) => v?.state === 'PRESENT',
    );
    const used = await disk();

    // Asked for by its sha256: not a byte is fetched.
    await fetchInto('shared-b', 'v2', [{ url: up.url('shared-b.bin'), sha256: sha256(body), file: 'weights.bin' }]);
    const b = await until(
      'present',
      () => versionOf('shared-b', 'v2'),
      (v) => v?.state === 'PRESENT',
    );
    expect(b.files[0]?.sha256).toBe(sha256(body));
    expect(up.requests.filter((r) => r.name === 'shared-b.bin')).toHaveLength(0);
    // Its digest only published by the upstream: the answer is dropped once the headers say what it is.
    await fetchInto('shared-c', 'v1', [{ url: up.url('shared-c.bin') }]);
    await until(
      'present',
      () => versionOf('shared-c', 'v1'),
      (v) => v?.state === 'PRESENT',
    );

    const a = await fs.stat(`${t.dataDir}/mirror/files/shared-a/v1/shared-a.bin`);
    const bStat = await fs.stat(`${t.dataDir}/mirror/files/shared-b/v2/weights.bin`);
    const c = await fs.stat(`${t.dataDir}/mirror/files/shared-c/v1/shared-c.bin`);
    expect([bStat.ino, c.ino]).toEqual([a.ino, a.ino]);
    expect(a.nlink).toBe(3);
    expect(await disk()).toBe(used);

    // Removing one leaves the others whole: the filesystem frees the blocks only when the last link goes.
    expect(
      (await t.gql('mutation { removeMirrorVersion(model: "shared-a", version: "v1") { __typename } }', {}, { token }))
        .data?.removeMirrorVersion.__typename,
    ).toBe('RemovedMirrorVersion');
    expect(sha256(await fs.readFile(`${t.dataDir}/mirror/files/shared-b/v2/weights.bin`))).toBe(sha256(body));
    expect((await fs.stat(`${t.dataDir}/mirror/files/shared-c/v1/shared-c.bin`)).nlink).toBe(2);
    expect(await disk()).toBe(used);
  }, 30_000);
});

describe('the bandwidth limit', () => {
  const SET = `mutation($b: Bytes) { setMirrorBandwidth(bytesPerSecond: $b) {
    __typename ... on MirrorBandwidth { bytesPerSecond } ... on ValidationError { field message } } }`;

  it('is changed from the console at once, holds every download to it, and refuses a limit too slow to use', async () => {
    const tooSlow = await t.gql(SET, { b: 10 }, { token });
    expect(tooSlow.data?.setMirrorBandwidth).toEqual({
      __typename: 'ValidationError',
      field: 'bytesPerSecond',
      message: 'bytesPerSecond: at least 65536 (64 KiB/s), or 0 for no limit',
    });
    const set = await t.gql(SET, { b: 1_000_000 }, { token });
    expect(set.data?.setMirrorBandwidth).toEqual({ __typename: 'MirrorBandwidth', bytesPerSecond: 1_000_000 });
    expect((await t.gql('{ mirror { bandwidthLimit } }', {}, { token })).data?.mirror.bandwidthLimit).toBe(1_000_000);
    try {
      const body = bytes(2_000_000, 44);
      up.files.set('limited.bin', { body });
      const started = Date.now();
      await fetchInto('limited', 'v1', [{ url: up.url('limited.bin'), sha256: sha256(body) }]);
      const done = await until(
        'present',
        () => versionOf('limited', 'v1'),
        (v) => v?.state === 'PRESENT',
      );
      expect(done.files[0]?.sha256).toBe(sha256(body));
      // 2 MB at 1 MB/s, less the quarter-second burst the bucket starts with: never much under two seconds.
      expect(Date.now() - started).toBeGreaterThanOrEqual(1500);
    } finally {
      const off = await t.gql(SET, { b: null }, { token });
      expect(off.data?.setMirrorBandwidth).toEqual({ __typename: 'MirrorBandwidth', bytesPerSecond: null });
    }
    const audit = await t.app.db.prisma.auditEvent.findMany({
      where: { action: 'setMirrorBandwidth', outcome: 'DONE' },
      orderBy: { id: 'asc' },
    });
    expect(audit.map((a) => a.message)).toEqual([
      'limited to 1000000 bytes per second for this server process until it restarts (was no limit)',
      'no limit for this server process until it restarts (was 1000000)',
    ]);
  }, 30_000);
});
