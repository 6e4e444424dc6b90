import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { bytes } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { downloadFile, HubApiError, listFiles, modelInfo } from '@huggingface/hub';
import { resolveModelFile } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeFile, type FakeHub, fileSha256, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { mayPullThrough, pulledModelName } from './pull-through.js';

// The pull-through cache (HANGAR_HF_PULL_THROUGH=on): a repository that is on the stand-in Hub and not in the
// mirror is read through /hf by @huggingface/hub, as a client pointed at Hangar reads it, and must arrive in the
// mirror verified, fetched from the Hub once however many clients ask.

const json = (v: unknown) => Buffer.from(JSON.stringify(v));
const files = (seed: number): FakeFile[] =>
  [
    { path: 'config.json', head: json({ model_type: 'llama', seed }), size: 0 },
    // Past @huggingface/hub's 1 MB threshold: it reads this one in Range requests.
    { path: 'model.safetensors', head: bytes(1_200_000, seed), size: 0, lfs: true },
    { path: 'onnx/model.onnx', head: bytes(4_000, seed + 1), size: 0, lfs: true },
  ].map((f) => ({ ...f, size: f.head.length }));

const PULLED = { id: 'acme/pulled', sha: 'a1'.repeat(20), files: files(11) };
const SHARED = { id: 'acme/shared', sha: 'b2'.repeat(20), files: files(21) };
const GONE = { id: 'acme/gone', sha: 'c3'.repeat(20), files: files(31) };
const LIAR = { id: 'acme/liar', sha: 'd4'.repeat(20), files: files(41) };
/** Bytes of the same size as LIAR's weights, kept in Git (not LFS), so the stand-in serves them itself. */
const DECOY = {
  id: 'acme/decoy',
  sha: 'f6'.repeat(20),
  files: [{ path: 'model.safetensors', head: bytes(1_200_000, 99), size: 1_200_000 }],
};
const FOR_VIEWER = { id: 'acme/not-for-viewers', sha: 'e5'.repeat(20), files: files(51) };
const sha = (r: { files: FakeFile[] }, p: string) => fileSha256(r.files.find((f) => f.path === p) as FakeFile);
const hashOf = async (blob: Blob | null) =>
  createHash('sha256')
    .update(Buffer.from(await (blob as Blob).arrayBuffer()))
    .digest('hex');

let hub: FakeHub;
let t: TestApp;
let hubUrl: string;
let hfToken: string;
/** The stand-in Hub's downloads (GET resolve) of one file of a repository. */
const upstreamGets = (repo: string, file: string) =>
  hub.requests.filter(
    (r) => r.method === 'GET' && r.path.startsWith(`/${repo}/resolve/`) && r.path.endsWith(`/${file}`),
  ).length;
const rows = (repo: { id: string; sha: string }) =>
  t.app.db.prisma.mirrorFile.findMany({
    where: { model: pulledModelName(repo.id), version: repo.sha },
    orderBy: { file: 'asc' },
  });

beforeAll(async () => {
  hub = await startFakeHub();
  for (const r of [PULLED, SHARED, GONE, LIAR, FOR_VIEWER]) hub.repos.set(r.id, { ...r });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_HF_PULL_THROUGH: 'on', HANGAR_MIRROR_RETRY_MAX: '50ms' });
  hubUrl = `${await t.app.start()}/hf`;
  hfToken = `hf_${await t.token('OPERATOR', 'hf-puller')}`;
}, 60_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

describe('pull-through: what the mirror lacks is fetched from the Hub on first request', () => {
  it('lists a repository the mirror lacks from the Hub, at the commit the Hub names for main', async () => {
    const listed = [];
    for await (const f of listFiles({ repo: PULLED.id, hubUrl, accessToken: hfToken, recursive: true })) listed.push(f);
    expect(listed.filter((f) => f.type === 'file').map((f) => [f.path, f.size, f.lfs?.oid])).toEqual([
      ['config.json', PULLED.files[0]?.size, undefined],
      ['model.safetensors', 1_200_000, sha(PULLED, 'model.safetensors')],
      ['onnx/model.onnx', 4_000, sha(PULLED, 'onnx/model.onnx')],
    ]);
    const info = await modelInfo({ name: PULLED.id, hubUrl, accessToken: hfToken, additionalFields: ['sha'] });
    expect(info.sha).toBe(PULLED.sha);
    // Listing is no download.
    expect(await rows(PULLED)).toEqual([]);
  });

  it('downloads a miss byte for byte, keeps it as a mirror version, PRESENT, and serves it from there after', async () => {
    for (const f of PULLED.files) {
      const blob = await downloadFile({ repo: PULLED.id, path: f.path, hubUrl, accessToken: hfToken });
      expect(await hashOf(blob), f.path).toBe(fileSha256(f));
    }
    const kept = await rows(PULLED);
    expect(kept.map((r) => [r.file, r.state, r.actualSha256, r.sourceUrl])).toEqual(
      PULLED.files.map((f) => [
        f.path,
        'PRESENT',
        fileSha256(f),
        `${hub.url}/${PULLED.id}/resolve/${PULLED.sha}/${f.path}`,
      ]),
    );
    // Verified against what the Hub published for the LFS files, not only hashed.
    expect(kept.find((r) => r.file === 'model.safetensors')?.expectedSha256).toBe(sha(PULLED, 'model.safetensors'));
    const onDisk = await fs.readFile(
      t.app.services.mirror.paths.file(pulledModelName(PULLED.id), PULLED.sha, 'onnx/model.onnx'),
    );
    expect(onDisk).toEqual(PULLED.files[2]?.head);
    // Now the mirror's: served from its disk, by commit too, with no more downloads from the Hub.
    const before = upstreamGets(PULLED.id, 'model.safetensors');
    const again = await downloadFile({
      repo: PULLED.id,
      path: 'model.safetensors',
      revision: PULLED.sha,
      hubUrl,
      accessToken: hfToken,
    });
    expect(await hashOf(again)).toBe(sha(PULLED, 'model.safetensors'));
    expect(upstreamGets(PULLED.id, 'model.safetensors')).toBe(before);
    expect(before).toBe(1);
    const head = await fetch(`${hubUrl}/${PULLED.id}/resolve/main/model.safetensors`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([head.status, head.headers.get('x-repo-commit'), head.headers.get('x-linked-etag')]).toEqual([
      200,
      PULLED.sha,
      `"${sha(PULLED, 'model.safetensors')}"`,
    ]);
  });

  it('answers a file the Hub does not have as the Hub does: 404 EntryNotFound, downloadFile null', async () => {
    expect(await downloadFile({ repo: PULLED.id, path: 'nope.bin', hubUrl, accessToken: hfToken })).toBeNull();
    const r = await fetch(`${hubUrl}/acme/nowhere/resolve/main/config.json`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'RepoNotFound']);
    expect((await r.json()).error).toMatch(/^acme\/nowhere is not in Hangar's mirror, and the Hub at .* has no/);
    // A commit is that commit: the Hub answering another one for it keeps nothing under its name.
    const other = await fetch(`${hubUrl}/${PULLED.id}/resolve/${'0'.repeat(40)}/config.json`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([other.status, other.headers.get('x-error-code')]).toEqual([404, 'RevisionNotFound']);
    expect(await t.app.db.prisma.mirrorFile.count({ where: { version: '0'.repeat(40) } })).toBe(0);
  });

  it('a Hub path the mirror cannot keep under its name answers 502 saying why, and keeps nothing', async () => {
    const odd = {
      id: 'acme/odd-names',
      sha: '8b'.repeat(20),
      files: [{ path: 'a file (1).json', head: json({}), size: 2 }],
    };
    hub.repos.set(odd.id, odd);
    const r = await fetch(`${hubUrl}/${odd.id}/resolve/main/${encodeURIComponent('a file (1).json')}`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect(r.status).toBe(502);
    expect((await r.json()).error).toMatch(
      /^a file \(1\)\.json of acme\/odd-names at 8b8b.* cannot be kept in Hangar's mirror: /,
    );
    expect(await rows(odd)).toEqual([]);
  });

  it('fetches a file once from the Hub for two clients asking at the same time', async () => {
    // Every answer of the stand-in Hub about this repository waits a little, so the two requests overlap.
    const repo = hub.repos.get(SHARED.id);
    if (repo) repo.delayMs = 300;
    const [a, b] = await Promise.all(
      [1, 2].map(() => downloadFile({ repo: SHARED.id, path: 'model.safetensors', hubUrl, accessToken: hfToken })),
    );
    expect([await hashOf(a ?? null), await hashOf(b ?? null)]).toEqual([
      sha(SHARED, 'model.safetensors'),
      sha(SHARED, 'model.safetensors'),
    ]);
    expect(upstreamGets(SHARED.id, 'model.safetensors')).toBe(1);
    // …and the Hub was asked for the commit and the listing once, too.
    expect(hub.requests.filter((r) => r.path.startsWith(`/api/models/${SHARED.id}/revision/`)).length).toBe(1);
  });

  it('the Hub gone mid-way: the client gets a clear error, and nothing half-kept claims PRESENT', async () => {
    // The listing answers; the bytes' host (the Hub's CDN, here a port nobody listens on) does not.
    const listed = [];
    for await (const f of listFiles({ repo: GONE.id, hubUrl, accessToken: hfToken })) listed.push(f.path);
    expect(listed).toContain('model.safetensors');
    hub.redirectLfs = () => 'http://127.0.0.1:1/cdn/model.safetensors';
    try {
      const err = await downloadFile({ repo: GONE.id, path: 'model.safetensors', hubUrl, accessToken: hfToken }).catch(
        (e) => e,
      );
      expect(err).toBeInstanceOf(HubApiError);
      expect(err.statusCode).toBe(502);
      expect(err.message).toMatch(
        /^fetching model.safetensors of acme\/gone at c3c3.* from the Hub (stalled|failed): /,
      );
      const kept = await rows(GONE);
      expect(kept.map((r) => r.file)).toEqual(['model.safetensors']);
      expect(kept[0]?.state).not.toBe('PRESENT');
      await expect(
        fs.stat(t.app.services.mirror.paths.file(pulledModelName(GONE.id), GONE.sha, 'model.safetensors')),
      ).rejects.toThrow(/ENOENT/);
      // …and a second client is told the same, not served a file.
      const r = await fetch(`${hubUrl}/${GONE.id}/resolve/${GONE.sha}/model.safetensors`, {
        method: 'HEAD',
        headers: { authorization: `Bearer ${hfToken}` },
      });
      expect(r.status).toBe(502);
    } finally {
      hub.redirectLfs = undefined;
    }
    // The Hub's API down as well: the listing fails, and so does the client, with why.
    hub.repos.set('acme/broken', { id: 'acme/broken', sha: '7'.repeat(40), files: files(61), broken: true });
    const down = await downloadFile({ repo: 'acme/broken', path: 'config.json', hubUrl, accessToken: hfToken }).catch(
      (e) => e,
    );
    expect(down).toBeInstanceOf(HubApiError);
    expect(down.statusCode).toBe(502);
    expect(down.message).toMatch(/^the Hub at http:\/\/127\.0\.0\.1:\d+ could not list acme\/broken at main: /);
    expect(await rows({ id: 'acme/broken', sha: '7'.repeat(40) })).toEqual([]);
  });

  it('bytes that do not match the sha256 the Hub published are never served, and the client sees why', async () => {
    // The Hub lists one sha256 and its CDN serves other bytes of the same size (the wrong object, a corrupt copy).
    hub.repos.set(DECOY.id, DECOY);
    hub.redirectLfs = (repo) =>
      repo.id === LIAR.id ? `${hub.url}/${DECOY.id}/resolve/${DECOY.sha}/model.safetensors` : 'http://127.0.0.1:1/';
    try {
      const err = await downloadFile({ repo: LIAR.id, path: 'model.safetensors', hubUrl, accessToken: hfToken }).catch(
        (e) => e,
      );
      expect(err).toBeInstanceOf(HubApiError);
      expect(err.statusCode).toBe(502);
      expect(err.message).toContain(`sha256 mismatch: expected ${sha(LIAR, 'model.safetensors')}`);
    } finally {
      hub.redirectLfs = undefined;
    }
    const [row] = await rows(LIAR);
    expect(row?.state).toBe('FAILED');
    await expect(
      fs.stat(t.app.services.mirror.paths.file(pulledModelName(LIAR.id), LIAR.sha, 'model.safetensors')),
    ).rejects.toThrow(/ENOENT/);
  });

  it("pulls llama.cpp's -hf GGUF through as well (node-llama-cpp's hf: URI)", async () => {
    const GGUF = {
      id: 'acme/tiny-pulled-GGUF',
      sha: '9a'.repeat(20),
      files: [
        { path: 'tiny-Q4_K_M.gguf', head: tinyLlama({ seed: 5 }), size: 0, lfs: true },
        { path: 'tiny-F16.gguf', head: tinyLlama({ seed: 6 }), size: 0, lfs: true },
      ].map((f) => ({ ...f, size: f.head.length })),
    };
    hub.repos.set(GGUF.id, GGUF);
    const file = await resolveModelFile(`hf:${GGUF.id}`, {
      directory: await fs.mkdtemp(path.join(t.dataDir, 'llama-models-')),
      cli: false,
      endpoints: { huggingFace: `${hubUrl}/` },
      tokens: { huggingFace: hfToken },
    });
    expect(
      createHash('sha256')
        .update(await fs.readFile(file))
        .digest('hex'),
    ).toBe(sha(GGUF, 'tiny-Q4_K_M.gguf'));
    // Only the one it asked for was fetched.
    expect((await rows(GGUF)).map((r) => [r.file, r.state])).toEqual([['tiny-Q4_K_M.gguf', 'PRESENT']]);
  });

  it("a viewer's token reads the mirror but does not fill it: a miss answers 404 as with pull-through off", async () => {
    const viewer = `hf_${await t.token('VIEWER', 'hf-viewer')}`;
    const asked = hub.requests.length;
    const err = await downloadFile({ repo: FOR_VIEWER.id, path: 'config.json', hubUrl, accessToken: viewer }).catch(
      (e) => e,
    );
    expect(err).toBeInstanceOf(HubApiError);
    expect(err.statusCode).toBe(404);
    expect(err.message).toMatch(/^acme\/not-for-viewers is not in Hangar's mirror/);
    expect(hub.requests.slice(asked).filter((r) => r.path.includes(FOR_VIEWER.id))).toEqual([]);
    expect(await rows(FOR_VIEWER)).toEqual([]);
    // What an operator pulled, a viewer reads.
    const blob = await downloadFile({ repo: PULLED.id, path: 'config.json', hubUrl, accessToken: viewer });
    expect(await hashOf(blob)).toBe(sha(PULLED, 'config.json'));
  });
});

describe('main is the commit the Hub names for it (issue 26: /hf poisoning)', () => {
  it('is not a newer commit the mirror fetched from the Hub by hand (a pull request’s, say)', async () => {
    const MAIN = { id: 'acme/branchy', sha: 'ab'.repeat(20), files: files(61).slice(0, 1) };
    const PR = { sha: 'cd'.repeat(20), files: [{ ...(MAIN.files[0] as FakeFile), head: json({ pr: 'evil' }) }] };
    (PR.files[0] as FakeFile).size = (PR.files[0] as FakeFile).head.length;
    // The Hub serves a pull request's commit too; an operator fetches its config.json after main's was mirrored.
    hub.repos.set(MAIN.id, { ...MAIN });
    const first = await downloadFile({ repo: MAIN.id, path: 'config.json', hubUrl, accessToken: hfToken });
    expect(await hashOf(first)).toBe(sha(MAIN, 'config.json'));
    hub.repos.set(MAIN.id, { id: MAIN.id, sha: PR.sha, files: PR.files });
    const operator = await t.token('OPERATOR', 'pr-fetcher');
    const r = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "branchy-pr", version: "pr1", sources: $s, fetchAnyway: true) { __typename ... on Error { message } } }',
      { s: [{ url: `${hub.url}/${MAIN.id}/resolve/${PR.sha}/config.json`, file: 'config.json' }] },
      { token: operator },
    );
    expect(r.data?.fetchToMirror.__typename).toBe('FetchStarted');
    const end = Date.now() + 20_000;
    while ((await t.app.db.prisma.mirrorFile.count({ where: { model: 'branchy-pr', state: 'PRESENT' } })) < 1) {
      if (Date.now() > end) throw new Error('the pull request’s file did not arrive');
      await new Promise((r) => setTimeout(r, 50));
    }
    hub.repos.set(MAIN.id, { ...MAIN });
    const head = await fetch(`${hubUrl}/${MAIN.id}/resolve/main/config.json`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([head.status, head.headers.get('x-repo-commit')]).toEqual([200, MAIN.sha]);
    expect(
      createHash('sha256')
        .update(Buffer.from(await head.arrayBuffer()))
        .digest('hex'),
    ).toBe(sha(MAIN, 'config.json'));
    const info = await modelInfo({ name: MAIN.id, hubUrl, accessToken: hfToken, additionalFields: ['sha'] });
    expect(info.sha).toBe(MAIN.sha);
    // A viewer may not ask the Hub: what the operator's listing heard for main answers them too.
    const viewer = `hf_${await t.token('VIEWER', 'branchy-viewer')}`;
    const seen = await downloadFile({ repo: MAIN.id, path: 'config.json', hubUrl, accessToken: viewer });
    expect(await hashOf(seen)).toBe(sha(MAIN, 'config.json'));
    const forViewer = await modelInfo({ name: MAIN.id, hubUrl, accessToken: viewer, additionalFields: ['sha'] });
    expect(forViewer.sha).toBe(MAIN.sha);
  });
});

describe('pull-through needs a registry', () => {
  it('with HANGAR_HUB_URL=off nothing is pulled through: a miss is a 404, whatever HANGAR_HF_PULL_THROUGH says', async () => {
    const off = await startTestApp({ HANGAR_HUB_URL: 'off', HANGAR_HF_PULL_THROUGH: 'on' });
    try {
      const url = `${await off.app.start()}/hf`;
      const token = `hf_${await off.token('ADMIN', 'hf-admin')}`;
      const asked = hub.requests.length;
      const r = await fetch(`${url}/${PULLED.id}/resolve/main/config.json`, {
        headers: { authorization: `Bearer ${token}` },
      });
      expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'RepoNotFound']);
      expect(hub.requests.length).toBe(asked);
    } finally {
      await off.close();
    }
  }, 60_000);
});

it('lets operators, admins, nodes and the server pull through, and not viewers or callers', () => {
  const user = { id: 'u', email: 'u@x', name: 'u' };
  expect(
    [
      { kind: 'user', user: { ...user, role: 'OPERATOR' }, role: 'OPERATOR', sessionId: 's' },
      { kind: 'token', user: { ...user, role: 'ADMIN' }, role: 'ADMIN', tokenId: 't', tokenName: 't' },
      { kind: 'node', node: { id: 'n', name: 'gpu-1' } },
      { kind: 'system', name: 'mirror' },
      { kind: 'user', user: { ...user, role: 'VIEWER' }, role: 'VIEWER', sessionId: 's' },
      // A token made by an admin, whose user is now a viewer, stands for the lower role.
      { kind: 'token', user: { ...user, role: 'VIEWER' }, role: 'VIEWER', tokenId: 't', tokenName: 't' },
      {
        kind: 'token',
        user: { ...user, role: 'ADMIN' },
        role: 'ADMIN',
        tokenId: 't',
        tokenName: 't',
        callerOnly: true,
      },
      { kind: 'anonymous' },
    ].map((v) => mayPullThrough(v as Parameters<typeof mayPullThrough>[0])),
  ).toEqual([true, true, true, true, false, false, false, false]);
});

it('keeps a pulled repository under a name the mirror accepts', () => {
  expect(pulledModelName('Acme/Tiny-Tok')).toBe('acme--tiny-tok');
  expect(pulledModelName('gpt2')).toBe('gpt2');
  const long = pulledModelName(`${'o'.repeat(60)}/${'n'.repeat(60)}`);
  expect(long).toHaveLength(100);
  expect(path.basename(long)).toMatch(/^o+--n+-[0-9a-f]{12}$/);
});
