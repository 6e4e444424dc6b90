import fs from 'node:fs/promises';
import path from 'node:path';
import { bytes, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { startTestApp } from './harness.js';

// What the mirror's server-side fetches reach and which credentials go with them, through fetchToMirror on a
// running server: a stand-in Hub that records the Authorization it was sent, a stand-in CDN and an "evil" host
// (fault upstreams, all on loopback), and a fake disk size for the free-space reservation.

// fetchAnyway: these files are random bytes under GGUF names, and the requests counted here are the downloads'.
const FETCH = `mutation($model: String!, $version: String!, $sources: [MirrorSourceInput!]!) {
  fetchToMirror(model: $model, version: $version, sources: $sources, fetchAnyway: true) {
    __typename
    ... on Error { message }
    ... on ValidationError { field }
  }
}`;
const VERSION = `query($m: String!, $v: String!) { mirrorVersion(model: $m, version: $v) { files { file state bytesDone error } } }`;

type FileView = { file: string; state: string; bytesDone: number; error: string | null };

let hub: FakeHub;
let up: Upstream;
const weights = bytes(50_000, 7);

beforeAll(async () => {
  hub = await startFakeHub();
  hub.repos.set('acme/gated', {
    id: 'acme/gated',
    sha: 'a'.repeat(40),
    gated: 'manual',
    files: [
      { path: 'small.bin', head: weights, size: weights.length },
      { path: 'big.gguf', head: weights, size: weights.length, lfs: true },
    ],
  });
  up = await startUpstream();
  up.files.set('big.gguf', { body: weights });
  up.files.set('w.bin', { body: weights });
});
afterAll(async () => {
  await hub?.close();
  await up?.close();
});

async function operator(env: Record<string, string>) {
  const t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_HUB_TOKEN: hub.token, ...env });
  await t.app.start();
  const token = await t.token('OPERATOR', 'mirror-ops');
  const fetchTo = async (model: string, version: string, sources: Record<string, unknown>[]) =>
    (await t.gql(FETCH, { model, version, sources }, { token })).data?.fetchToMirror;
  const settled = async (model: string, version: string, files: number): Promise<FileView[]> => {
    const end = Date.now() + 20_000;
    for (;;) {
      const r = await t.gql(VERSION, { m: model, v: version }, { token });
      const got: FileView[] = r.data?.mirrorVersion?.files ?? [];
      if (got.length === files && got.every((f) => ['PRESENT', 'FAILED', 'CANCELLED'].includes(f.state))) return got;
      if (Date.now() > end) throw new Error(`${model}/${version} did not settle: ${JSON.stringify(got)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const files = async (model: string, version: string): Promise<FileView[]> =>
    (await t.gql(VERSION, { m: model, v: version }, { token })).data?.mirrorVersion?.files ?? [];
  return { t, token, fetchTo, settled, files };
}

describe('with HANGAR_FETCH_ALLOW unset', () => {
  let o: Awaited<ReturnType<typeof operator>>;
  beforeAll(async () => {
    o = await operator({ HANGAR_FETCH_ALLOW: '' }); // empty is unset: the default, nothing listed
  });
  afterAll(async () => {
    await o?.t.close();
  });

  it('refuses a loopback URL, or a name for one, at once and naming the setting; nothing is recorded', async () => {
    const before = up.requests.length;
    const byAddress = await o.fetchTo('m', 'v1', [{ url: up.url('w.bin') }]);
    expect(byAddress).toMatchObject({ __typename: 'ValidationError', field: 'sources.0.url' });
    expect(byAddress.message).toMatch(
      /^sources\.0\.url: 127\.0\.0\.1:\d+ is a loopback address: the server fetches only from public addresses unless HANGAR_FETCH_ALLOW lists the host or its network/,
    );
    const byName = await o.fetchTo('m', 'v1', [{ url: up.url('w.bin').replace('127.0.0.1', 'localhost') }]);
    expect(byName).toMatchObject({ __typename: 'ValidationError', field: 'sources.0.url' });
    expect(byName.message).toMatch(/^sources\.0\.url: localhost:\d+ \(at (127\.0\.0\.1|::1)\) is a loopback address/);
    const metadata = await o.fetchTo('m', 'v1', [{ url: 'http://169.254.169.254/latest/meta-data/iam' }]);
    expect(metadata.message).toMatch(/link-local/);
    expect((await o.t.gql(VERSION, { m: 'm', v: 'v1' }, o)).data?.mirrorVersion).toBeNull();
    expect(up.requests.length).toBe(before);
  });

  it('fetches from the configured Hub, which is on loopback too, with its token', async () => {
    hub.requests.length = 0;
    const r = await o.fetchTo('acme-gated', 'v1', [{ url: `${hub.url}/acme/gated/resolve/main/small.bin` }]);
    expect(r.__typename).toBe('FetchStarted');
    expect(await o.settled('acme-gated', 'v1', 1)).toMatchObject([{ state: 'PRESENT', bytesDone: weights.length }]);
    expect(hub.requests.map((q) => q.authorization)).toEqual([`Bearer ${hub.token}`]);
  });

  it("never follows the Hub's redirect into a network nobody listed", async () => {
    hub.redirectLfs = (_, f) => up.url(f.path);
    const before = up.requests.length;
    try {
      await o.fetchTo('acme-gated', 'v2', [{ url: `${hub.url}/acme/gated/resolve/main/big.gguf` }]);
      const [file] = await o.settled('acme-gated', 'v2', 1);
      expect(file?.state).toBe('FAILED');
      expect(file?.error).toMatch(/^refused: a redirect led to 127\.0\.0\.1:\d+ is a loopback address/);
      expect(up.requests.length).toBe(before);
    } finally {
      hub.redirectLfs = undefined;
    }
  });
});

describe('with the stand-ins on loopback allowed (HANGAR_FETCH_ALLOW=127.0.0.1)', () => {
  let o: Awaited<ReturnType<typeof operator>>;
  beforeAll(async () => {
    o = await operator({ HANGAR_FETCH_ALLOW: '127.0.0.1' });
  });
  afterAll(async () => {
    await o?.t.close();
  });

  it("sends the Hub's token to the Hub, and not to the CDN it redirects an LFS file to", async () => {
    hub.redirectLfs = (_, f) => up.url(f.path);
    hub.requests.length = 0;
    up.requests.length = 0;
    try {
      await o.fetchTo('acme-gated', 'v3', [{ url: `${hub.url}/acme/gated/resolve/main/big.gguf` }]);
      expect(await o.settled('acme-gated', 'v3', 1)).toMatchObject([{ state: 'PRESENT' }]);
      expect(hub.requests.map((q) => q.authorization)).toEqual([`Bearer ${hub.token}`]);
      expect(up.requests.map((q) => [q.name, q.authorization ?? null])).toEqual([['big.gguf', null]]);
    } finally {
      hub.redirectLfs = undefined;
    }
  });

  it("sends no token to a host whose URL only starts like the Hub's (user:password@ before the real host)", async () => {
    up.requests.length = 0;
    // HANGAR_HUB_URL is http://127.0.0.1:<hub port>; this URL begins with exactly that, and goes to the upstream.
    const trick = up.url('w.bin').replace('http://', `${hub.url}@`);
    expect(trick.startsWith(hub.url)).toBe(true);
    await o.fetchTo('trick', 'v1', [{ url: trick }]);
    expect(await o.settled('trick', 'v1', 1)).toMatchObject([{ state: 'PRESENT' }]);
    expect(up.requests.map((q) => [q.name, q.authorization ?? null])).toEqual([['w.bin', null]]);
  });

  it('reserves what each running download still needs: on room for one of three, one completes and two stop before a byte', async () => {
    // A disk of 200 kB holding what the mirror has written, and three files of 120 kB fetched at once.
    const size = 120_000;
    const capacity = 200_000;
    const mirror = o.t.app.services.mirror;
    const root = path.join(o.t.dataDir, 'mirror');
    const before = await bytesUnder(root); // the earlier tests' files
    mirror.diskFree = async () => capacity - ((await bytesUnder(root)) - before);
    // Slow enough that all three are under way together: the first holds its room while the others ask.
    for (const n of ['a', 'b', 'c'])
      up.files.set(`${n}.bin`, {
        body: bytes(size, n.charCodeAt(0)),
        fault: { kind: 'drip', chunk: 20_000, everyMs: 100 },
      });
    const r = await o.fetchTo(
      'tight',
      'v1',
      ['a', 'b', 'c'].map((n) => ({ url: up.url(`${n}.bin`) })),
    );
    expect(r.__typename).toBe('FetchStarted');
    const files = await o.settled('tight', 'v1', 3);
    const present = files.filter((f) => f.state === 'PRESENT');
    const failed = files.filter((f) => f.state === 'FAILED');
    expect(present).toHaveLength(1);
    expect(present[0]?.bytesDone).toBe(size);
    expect(failed).toHaveLength(2);
    for (const f of failed) {
      expect(f.bytesDone).toBe(0); // stopped before wasting a byte
      expect(f.error).toMatch(
        new RegExp(
          `^not enough disk: tight/v1/${f.file} has ${size} bytes still to come and \\d+ are free under .* once the \\d+ bytes that other running downloads still need are set aside`,
        ),
      );
    }
  });
});

describe('the fetch-time disk check', () => {
  let o: Awaited<ReturnType<typeof operator>>;
  beforeAll(async () => {
    o = await operator({ HANGAR_FETCH_ALLOW: '127.0.0.1' });
  });
  afterAll(async () => {
    await o?.t.close();
  });

  it('counts what a running download still needs, though its size was never given', async () => {
    const capacity = 200_000;
    const root = path.join(o.t.dataDir, 'mirror');
    o.t.app.services.mirror.diskFree = async () => capacity - (await bytesUnder(root));
    up.files.set('slow.bin', { body: bytes(120_000, 3), fault: { kind: 'drip', chunk: 4_000, everyMs: 100 } });
    await o.fetchTo('running', 'v1', [{ url: up.url('slow.bin') }]);
    // Under way: the upstream has said its size and some bytes are on disk.
    const end = Date.now() + 10_000;
    for (;;) {
      if (((await o.files('running', 'v1'))[0]?.bytesDone ?? 0) > 0) break;
      if (Date.now() > end) throw new Error('the download did not start');
      await new Promise((r) => setTimeout(r, 50));
    }
    // 100 kB would fit in what the disk has free, but not beside what the running download still needs.
    const r = await o.fetchTo('next', 'v1', [{ url: up.url('w.bin'), size: 100_000 }]);
    expect(r).toMatchObject({ __typename: 'ConflictError' });
    expect(r.message).toMatch(
      /^not enough disk for next\/v1: it needs 100000 bytes and \d+ are free under .* \(after what the downloads under way still need\)/,
    );
    await o.t.gql('mutation { cancelMirrorFetch(model: "running", version: "v1") { __typename } }', {}, o);
  });
});

async function bytesUnder(dir: string): Promise<number> {
  let n = 0;
  for (const e of await fs.readdir(dir, { withFileTypes: true, recursive: true }).catch(() => [])) {
    if (e.isFile()) n += (await fs.stat(path.join(e.parentPath, e.name)).catch(() => ({ size: 0 }))).size;
  }
  return n;
}
