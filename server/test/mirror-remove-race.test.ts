import { createHash } from 'node:crypto';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { blobClaimHooks } from '../src/mirror/blob-claims.js';
import { startTestApp, type TestApp } from './harness.js';

// A version removed while another version lands the same bytes, on the `file` store (the bucket's case is in
// mirror-s3-control.test.ts): the landing had chosen the removed version's file as the held copy to link, and
// finds it gone. The fault upstream stands in for a file server that publishes the sha256 (ETag), as the Hub does.

let t: TestApp;
let base: string;
let token: string;
let up: Upstream;

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
async function until<T>(what: string, probe: () => Promise<T | null | undefined | false>, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
const gql = (query: string, variables: Record<string, unknown> = {}) => t.gql(query, variables, { token });
// No sha256 given: the upstream's published one is what the mirror learns, and asks the held copies about.
const fetchTo = (model: string, url: string) =>
  gql(
    'mutation($m: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: $m, version: "v1", sources: $s) { __typename ... on Error { message } } }',
    { m: model, s: [{ url, file: 'shared.bin' }] },
  );
const row = (model: string) => t.app.db.prisma.mirrorFile.findFirst({ where: { model } });

beforeAll(async () => {
  up = await startUpstream();
  t = await startTestApp();
  base = await t.app.start();
  token = await t.token('OPERATOR', 'race-operator');
}, 60_000);
afterAll(async () => {
  await t?.close();
  await up?.close();
});

describe('a removal racing a landing on the file store', () => {
  it('fetches a file again whose held copy went with its removed version, never lists it empty', async () => {
    const body = bytes(200_000, 51);
    const want = sha(body);
    up.files.set('shared.bin', { body });
    await fetchTo('held-a', up.url('shared.bin'));
    await until('held-a PRESENT', async () => (await row('held-a'))?.state === 'PRESENT');
    // held-b learns from the upstream's headers that held-a has these bytes, takes none of them, and is about to
    // link held-a's file, when held-a is removed.
    let removed = false;
    blobClaimHooks.beforeLink = async () => {
      if (removed) return;
      removed = true;
      const r = await gql(
        'mutation { removeMirrorVersion(model: "held-a", version: "v1") { __typename ... on Error { message } } }',
      );
      expect(r.data?.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
    };
    const n = up.requests.length;
    try {
      await fetchTo('held-b', up.url('shared.bin'));
      const b = await until('held-b PRESENT', async () => {
        const r = await row('held-b');
        if (r?.state === 'FAILED') throw new Error(r.error ?? 'failed');
        return r?.state === 'PRESENT' && r;
      });
      expect(removed).toBe(true);
      expect(b.actualSha256).toBe(want);
    } finally {
      blobClaimHooks.beforeLink = undefined;
    }
    const got = await fetch(`${base}/mirror/held-b/v1/shared.bin`, { headers: { authorization: `Bearer ${token}` } });
    expect(got.status).toBe(200);
    const served = Buffer.from(await got.arrayBuffer());
    expect(served.length).toBe(body.length);
    expect(sha(served)).toBe(want);
    // Asked once, answered with the sha256 and left unread; then fetched for real once the copy was gone.
    expect(up.requests.slice(n).filter((q) => q.name === 'shared.bin')).toHaveLength(2);
  }, 120_000);
});
