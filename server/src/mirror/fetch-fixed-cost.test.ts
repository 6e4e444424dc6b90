import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { MirrorLanding } from './mirror-landing.js';
import { fileLeases, mirrorPoll } from './mirror-worker.js';

// What every fetch costs whatever its size (#33): a file this replica queues is claimed when it is queued, never
// left for the poll, and the worker looks for a held copy of its bytes once. The poll is an hour here, so a fetch
// that waited for it would not start within the test: whatever starts does so because the worker was woken.

let t: TestApp;
let up: Upstream;
let token: string;
const pollWas = mirrorPoll.ms;
beforeAll(async () => {
  mirrorPoll.ms = 3_600_000;
  t = await startTestApp();
  await t.app.start();
  up = await startUpstream();
  token = await t.token('OPERATOR', 'mirror-wake');
});
afterAll(async () => {
  mirrorPoll.ms = pollWas;
  await t?.close();
  await up?.close();
});

const FETCH = `mutation($m: String!, $v: String!, $s: [MirrorSourceInput!]!) {
  fetchToMirror(model: $m, version: $v, sources: $s, fetchAnyway: true) {
    __typename ... on FetchStarted { started } ... on Error { message } } }`;

async function fetchInto(version: string, file: string, sha: string | null) {
  const source = sha ? { url: up.url(file), file, sha256: sha } : { url: up.url(file), file };
  const r = await t.gql(FETCH, { m: 'wake', v: version, s: [source] }, { token });
  expect(r.data?.fetchToMirror.__typename, JSON.stringify(r)).toBe('FetchStarted');
  return r.data?.fetchToMirror.started as number;
}

async function settled(version: string) {
  const end = Date.now() + 20_000;
  for (;;) {
    const rows = await t.app.db.prisma.mirrorFile.findMany({ where: { model: 'wake', version } });
    if (rows.length && rows.every((r) => ['PRESENT', 'FAILED', 'CANCELLED'].includes(r.state))) return rows;
    if (Date.now() > end)
      throw new Error(
        `wake/${version} did not settle: ${JSON.stringify(rows, (_, v) => (typeof v === 'bigint' ? Number(v) : v))}`,
      );
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('waking the mirror worker', () => {
  it('claims a file queued while a claim is under way once that claim ends, not at the next poll', async () => {
    const first = bytes(64_000, 33);
    const second = bytes(64_000, 34);
    up.files.set('first.bin', { body: first });
    up.files.set('second.bin', { body: second });
    expect(await fetchInto('v1', 'first.bin', sha256(first))).toBe(1);
    expect((await settled('v1'))[0]?.state).toBe('PRESENT');

    // A claim that finds nothing and is slow to come back (a loaded database): it is held after its query ran.
    let entered = () => {};
    const inClaim = new Promise<void>((r) => {
      entered = r;
    });
    let release = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const claim = fileLeases.claim.bind(fileLeases);
    const claims = vi.spyOn(fileLeases, 'claim').mockImplementationOnce(async (...args) => {
      const row = await claim(...args);
      entered();
      await gate;
      return row;
    });
    try {
      // Asked for again, the present version starts nothing, and the worker is kicked: its claim is held.
      expect(await fetchInto('v1', 'first.bin', sha256(first))).toBe(0);
      await inClaim;
      // Queued while that claim is under way: its kick comes while the worker is still busy claiming.
      expect(await fetchInto('v2', 'second.bin', sha256(second))).toBe(1);
      release();
      const [row] = await settled('v2');
      expect(row).toMatchObject({ state: 'PRESENT', actualSha256: sha256(second) });
      expect(claims.mock.calls.length).toBeGreaterThanOrEqual(2);
    } finally {
      release();
      claims.mockRestore();
    }
  }, 60_000);
});

describe('a held copy of the bytes', () => {
  it('is looked for once by the worker, and linked without a second look, whether asked by sha256 or published', async () => {
    const body = bytes(48_000, 35);
    up.files.set('held.bin', { body });
    expect(await fetchInto('h1', 'held.bin', sha256(body))).toBe(1);
    expect((await settled('h1'))[0]?.state).toBe('PRESENT');
    const looks = vi.spyOn(MirrorLanding.prototype, 'heldCopy');
    try {
      // Asked for by its sha256: the worker finds the copy before any request, and links it.
      up.requests.length = 0;
      expect(await fetchInto('h2', 'held.bin', sha256(body))).toBe(1);
      const [byDigest] = await settled('h2');
      expect(byDigest).toMatchObject({ state: 'PRESENT', actualSha256: sha256(body) });
      expect(up.requests).toHaveLength(0);
      // The mutation's own look is for the requester (except: null); the worker's name the file's row.
      const worker = (id: string) => looks.mock.calls.filter((c) => c[1] === id).length;
      expect(worker(byDigest?.id as string)).toBe(1);

      // Asked for by URL only: the upstream's answer publishes the sha256, and the copy is linked before the body.
      expect(await fetchInto('h3', 'held.bin', null)).toBe(1);
      const [published] = await settled('h3');
      expect(published).toMatchObject({ state: 'PRESENT', actualSha256: sha256(body) });
      expect(worker(published?.id as string)).toBe(1);
    } finally {
      looks.mockRestore();
    }
  }, 60_000);
});
