import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { bytes } from '@hangar/common/test/fixtures/fault-upstream';
import { tinyLlama } from '@hangar/common/test/fixtures/tiny-llama';
import { downloadFile, fileDownloadInfo, HubApiError, listFiles, modelInfo } from '@huggingface/hub';
import { resolveModelFile } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FakeFile, type FakeHub, fileSha256, startFakeHub } from '../../test/fixtures/fake-hub.js';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { baseFilesFromMirror } from '../train/base-files.js';

// The mirror over the Hub's protocol, read by @huggingface/hub (the Hub's own JS client, nobody here wrote it)
// with its hub URL set to Hangar's /hf: a repository is fetched from the stand-in Hub into the mirror the way a
// script or the registry fetches one (resolve URLs at a commit), then downloaded back through /hf.

const REPO = 'acme/tiny-tok';
const COMMIT = 'c0ffee1234'.repeat(4);
const json = (v: unknown) => Buffer.from(JSON.stringify(v));
const FILES: FakeFile[] = [
  { path: 'config.json', head: json({ model_type: 'llama', vocab_size: 8 }), size: 0 },
  { path: 'tokenizer_config.json', head: json({ tokenizer_class: 'PreTrainedTokenizerFast' }), size: 0 },
  // Past @huggingface/hub's 1 MB in-memory threshold, so it reads it with Range requests.
  { path: 'model.safetensors', head: bytes(1_200_000, 7), size: 0, lfs: true },
  { path: 'onnx/model_quantized.onnx', head: bytes(5_000, 3), size: 0, lfs: true },
].map((f) => ({ ...f, size: f.head.length }));
const sha = (p: string) => fileSha256(FILES.find((f) => f.path === p) as FakeFile);

let hub: FakeHub;
let t: TestApp;
let base: string;
let hubUrl: string;
let token: string;
/** A Hangar API token as HF_TOKEN holds it: the JS client refuses one that does not start with hf_. */
let hfToken: string;

async function mirrored(model: string, version: string, sources: { url: string; file: string; sha256?: string }[]) {
  const r = await t.gql(
    'mutation($m: String!, $v: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: $m, version: $v, sources: $s) { __typename ... on Error { message } } }',
    { m: model, v: version, s: sources },
    { token },
  );
  expect(r.data?.fetchToMirror.__typename).toBe('FetchStarted');
  const end = Date.now() + 20_000;
  while ((await t.app.db.prisma.mirrorFile.count({ where: { model, version, state: 'PRESENT' } })) < sources.length) {
    if (Date.now() > end) throw new Error(`${model}/${version} did not arrive in the mirror`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  hub = await startFakeHub();
  hub.repos.set(REPO, { id: REPO, sha: COMMIT, files: FILES });
  hub.repos.set('acme/by-branch', { id: 'acme/by-branch', sha: 'd'.repeat(40), files: FILES.slice(0, 1) });
  t = await startTestApp({ HANGAR_HUB_URL: hub.url });
  base = await t.app.start();
  hubUrl = `${base}/hf`;
  token = await t.token('OPERATOR', 'hf-reader');
  hfToken = `hf_${token}`;
  await mirrored(
    'tiny-tok',
    COMMIT.slice(0, 7),
    FILES.map((f) => ({
      url: `${hub.url}/${REPO}/resolve/${COMMIT}/${f.path}`,
      file: f.path,
      sha256: fileSha256(f),
    })),
  );
  // Fetched by a branch, not a commit: what the branch pointed at is unknown, so /hf does not serve it.
  await mirrored('by-branch', 'main', [
    { url: `${hub.url}/acme/by-branch/resolve/main/config.json`, file: 'config.json' },
  ]);
}, 60_000);
afterAll(async () => {
  await t?.close();
  await hub?.close();
});

describe('the Hub protocol under /hf, read by @huggingface/hub', () => {
  it('lists the mirrored files (listFiles), top level and recursively, with their sha256 as lfs.oid', async () => {
    const top = [];
    for await (const f of listFiles({ repo: REPO, hubUrl, accessToken: hfToken })) top.push(f);
    expect(top.map((f) => [f.type, f.path])).toEqual([
      ['file', 'config.json'],
      ['file', 'model.safetensors'],
      ['directory', 'onnx'],
      ['file', 'tokenizer_config.json'],
    ]);
    const all = [];
    for await (const f of listFiles({ repo: REPO, hubUrl, accessToken: hfToken, recursive: true, revision: COMMIT }))
      all.push(f);
    const onnx = all.find((f) => f.path === 'onnx/model_quantized.onnx');
    expect(onnx).toMatchObject({
      type: 'file',
      size: 5_000,
      lfs: { oid: sha('onnx/model_quantized.onnx'), size: 5_000 },
    });
    expect(onnx?.oid).toMatch(/^[0-9a-f]{40}$/);
    const inFolder = [];
    for await (const f of listFiles({ repo: REPO, hubUrl, accessToken: hfToken, path: 'onnx' })) inFolder.push(f.path);
    expect(inFolder).toEqual(['onnx/model_quantized.onnx']);
  });

  it('downloads files byte for byte (downloadFile), the large one in ranges', async () => {
    for (const f of FILES) {
      const blob = await downloadFile({ repo: REPO, path: f.path, hubUrl, accessToken: hfToken });
      expect(blob, f.path).not.toBeNull();
      const got = Buffer.from(await (blob as Blob).arrayBuffer());
      expect(createHash('sha256').update(got).digest('hex'), f.path).toBe(fileSha256(f));
    }
    const info = await fileDownloadInfo({ repo: REPO, path: 'model.safetensors', hubUrl, accessToken: hfToken });
    expect(info).toMatchObject({ size: 1_200_000, etag: `"${sha('model.safetensors')}"` });
    const part = await (await downloadFile({ repo: REPO, path: 'model.safetensors', hubUrl, accessToken: hfToken }))
      ?.slice(1000, 1010)
      .arrayBuffer();
    expect(Buffer.from(part as ArrayBuffer)).toEqual(FILES[2]?.head.subarray(1000, 1010));
  });

  it('answers model info with the mirrored commit and every sibling (modelInfo)', async () => {
    const info = await modelInfo({ name: REPO, hubUrl, accessToken: hfToken, additionalFields: ['sha', 'filePaths'] });
    expect(info).toMatchObject({ name: REPO, sha: COMMIT, private: false });
    expect(info.filePaths.sort()).toEqual(FILES.map((f) => f.path).sort());
    const raw = await fetch(`${hubUrl}/api/models/${REPO}/revision/main`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    const body = await raw.json();
    expect(body.sha).toBe(COMMIT);
    expect(body.siblings).toContainEqual({
      rfilename: 'model.safetensors',
      size: 1_200_000,
      blobId: expect.stringMatching(/^[0-9a-f]{40}$/),
      lfs: { sha256: sha('model.safetensors'), size: 1_200_000, pointerSize: expect.any(Number) },
    });
    expect(body.siblings.map((s: { rfilename: string }) => s.rfilename).sort()).toEqual(
      FILES.map((f) => f.path).sort(),
    );
    const plain = await fetch(`${hubUrl}/api/models/${REPO}`, { headers: { authorization: `Bearer ${token}` } });
    expect((await plain.json()).sha).toBe(COMMIT);
  });

  it("answers resolve with the headers huggingface_hub reads, by branch and by commit, and a Range's 206", async () => {
    for (const rev of ['main', COMMIT]) {
      const head = await fetch(`${hubUrl}/${REPO}/resolve/${rev}/model.safetensors`, {
        method: 'HEAD',
        headers: { authorization: `Bearer ${hfToken}`, 'accept-encoding': 'identity' },
      });
      expect(head.status).toBe(200);
      expect(
        Object.fromEntries(
          ['x-repo-commit', 'etag', 'x-linked-etag', 'x-linked-size', 'content-length', 'accept-ranges'].map((h) => [
            h,
            head.headers.get(h),
          ]),
        ),
      ).toEqual({
        'x-repo-commit': COMMIT,
        etag: `"${sha('model.safetensors')}"`,
        'x-linked-etag': `"${sha('model.safetensors')}"`,
        'x-linked-size': '1200000',
        'content-length': '1200000',
        'accept-ranges': 'bytes',
      });
    }
    const part = await fetch(`${hubUrl}/${REPO}/resolve/main/model.safetensors`, {
      headers: { authorization: `Bearer ${hfToken}`, range: 'bytes=100-199' },
    });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe('bytes 100-199/1200000');
    expect(part.headers.get('x-repo-commit')).toBe(COMMIT);
    expect(Buffer.from(await part.arrayBuffer())).toEqual(FILES[2]?.head.subarray(100, 200));
  });
});

describe('what is not mirrored answers as the Hub does', () => {
  const get = (p: string, method = 'GET') =>
    fetch(`${hubUrl}${p}`, { method, headers: { authorization: `Bearer ${hfToken}` } });

  it('a missing repository: 404 RepoNotFound, and the client throws its API error', async () => {
    for (const p of [
      '/api/models/acme/absent',
      '/api/models/acme/absent/tree/main',
      '/acme/absent/resolve/main/config.json',
    ]) {
      const r = await get(p);
      expect([p, r.status, r.headers.get('x-error-code')]).toEqual([p, 404, 'RepoNotFound']);
      expect((await r.json()).error).toBe("acme/absent is not in Hangar's mirror");
    }
    const err = await downloadFile({ repo: 'acme/absent', path: 'config.json', hubUrl, accessToken: hfToken }).catch(
      (e) => e,
    );
    expect(err).toBeInstanceOf(HubApiError);
    expect(err.statusCode).toBe(404);
    expect(err.message).toMatch(/^acme\/absent is not in Hangar's mirror/);
  });

  it('with pull-through off (the default) a repository the Hub has is not fetched: 404 as for any other', async () => {
    hub.repos.set('acme/on-the-hub', { id: 'acme/on-the-hub', sha: 'f'.repeat(40), files: FILES.slice(0, 1) });
    const asked = hub.requests.length;
    for (const p of ['/api/models/acme/on-the-hub', '/acme/on-the-hub/resolve/main/config.json']) {
      const r = await get(p);
      expect([p, r.status, r.headers.get('x-error-code')]).toEqual([p, 404, 'RepoNotFound']);
    }
    expect(await t.app.db.prisma.mirrorFile.count({ where: { sourceUrl: { contains: 'on-the-hub' } } })).toBe(0);
    expect(hub.requests.slice(asked)).toEqual([]);
  });

  it('a missing file: 404 EntryNotFound, which downloadFile answers as null', async () => {
    const r = await get(`/${REPO}/resolve/main/nope.bin`, 'HEAD');
    expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'EntryNotFound']);
    expect(await downloadFile({ repo: REPO, path: 'nope.bin', hubUrl, accessToken: hfToken })).toBeNull();
    const folder = await get(`/api/models/${REPO}/tree/main/nowhere`);
    expect([folder.status, folder.headers.get('x-error-code')]).toEqual([404, 'EntryNotFound']);
  });

  it('a commit that was not mirrored: 404 RevisionNotFound', async () => {
    const r = await get(`/${REPO}/resolve/${'e'.repeat(40)}/config.json`);
    expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'RevisionNotFound']);
  });

  it('files mirrored by a branch URL are not claimed for any commit', async () => {
    const r = await get('/api/models/acme/by-branch');
    expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'RepoNotFound']);
    // …though /mirror still serves them under their Hangar name.
    const direct = await fetch(`${base}/mirror/by-branch/main/config.json`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(direct.status).toBe(200);
  });
});

describe('tokens on /hf: the same rules as /mirror', () => {
  it('refuses a request without a credential, as the mirror does by default', async () => {
    const r = await fetch(`${hubUrl}/${REPO}/resolve/main/config.json`);
    expect(r.status).toBe(401);
    expect((await r.json()).error).toMatch(/^the mirror needs a credential/);
    const err = await downloadFile({ repo: REPO, path: 'config.json', hubUrl }).catch((e) => e);
    expect(err).toBeInstanceOf(HubApiError);
    expect(err.statusCode).toBe(401);
  });

  it('refuses a token Hangar does not know, hf_ or not, in the Hub words for a bad token', async () => {
    for (const bad of ['hf_hgr_not-a-token-anyone-made', 'hf_realHubTokenLooksLikeThis', 'hgr_unknown']) {
      const r = await fetch(`${hubUrl}/${REPO}/resolve/main/config.json`, {
        headers: { authorization: `Bearer ${bad}` },
      });
      expect([bad, r.status, r.headers.get('x-error-message')]).toEqual([
        bad,
        401,
        'Invalid credentials in Authorization header',
      ]);
    }
    const err = await downloadFile({ repo: REPO, path: 'config.json', hubUrl, accessToken: 'hf_hgr_nope' }).catch(
      (e) => e,
    );
    expect(err.statusCode).toBe(401);
    expect(err.message).toMatch(/^this API token is not known/);
  });

  it('takes hf_ off only on /hf: /mirror wants the token as Hangar made it', async () => {
    const r = await fetch(`${base}/mirror/tiny-tok/${COMMIT.slice(0, 7)}/config.json`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect(r.status).toBe(401);
  });
});

describe('paths that climb out', () => {
  /** A raw request: fetch would resolve '..' before sending it. */
  const raw = (p: string) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const u = new URL(base);
      const req = http.request(
        { host: u.hostname, port: u.port, path: p, headers: { authorization: `Bearer ${hfToken}` } },
        (res) => {
          let body = '';
          res.on('data', (c) => {
            body += c;
          });
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on('error', reject);
      req.end();
    });

  it("refuses '..' and NUL with 400 and reads nothing outside the mirror", async () => {
    // A file beside the mirror, where a climbing path would land.
    const secret = 'not for downloading';
    await fs.writeFile(path.join(t.dataDir, 'secret.txt'), secret);
    await fs.writeFile(path.join(t.dataDir, 'mirror', 'secret.txt'), secret);
    for (const p of [
      `/hf/${REPO}/resolve/main/../../../secret.txt`,
      `/hf/${REPO}/resolve/main/..%2F..%2F..%2F..%2Fsecret.txt`,
      `/hf/${REPO}/resolve/main/%2e%2e/%2e%2e/secret.txt`,
      `/hf/${REPO}/resolve/main/onnx/../config.json`,
      `/hf/acme/..%2F..%2Fsecret/resolve/main/config.json`,
      `/hf/api/models/${REPO}/tree/main/..%2F..`,
      `/hf/${REPO}/resolve/main/config.json%00`,
    ]) {
      const r = await raw(p);
      expect([p, r.status]).toEqual([p, 400]);
      expect(r.body).not.toContain(secret);
    }
  });
});

describe("llama.cpp's -hf manifest, read by node-llama-cpp's hf: URIs", () => {
  const GGUF_REPO = 'acme/tiny-llama-GGUF';
  const GGUF_COMMIT = 'abcdef0123'.repeat(4);
  const GGUFS: FakeFile[] = [
    { path: 'tiny-llama-Q4_K_M.gguf', head: tinyLlama({ seed: 1 }), size: 0, lfs: true },
    { path: 'tiny-llama-BF16.gguf', head: tinyLlama({ seed: 2 }), size: 0, lfs: true },
  ].map((f) => ({ ...f, size: f.head.length }));

  beforeAll(async () => {
    hub.repos.set(GGUF_REPO, { id: GGUF_REPO, sha: GGUF_COMMIT, files: GGUFS });
    await mirrored(
      'tiny-llama-gguf',
      GGUF_COMMIT.slice(0, 7),
      GGUFS.map((f) => ({
        url: `${hub.url}/${GGUF_REPO}/resolve/${GGUF_COMMIT}/${f.path}`,
        file: f.path,
        sha256: fileSha256(f),
      })),
    );
  }, 60_000);

  it('picks the GGUF for a quantisation (Q4_K_M for latest) and downloads it whole', async () => {
    const directory = await fs.mkdtemp(path.join(t.dataDir, 'llama-models-'));
    const common = {
      directory,
      cli: false,
      endpoints: { huggingFace: `${hubUrl}/` },
      tokens: { huggingFace: hfToken },
    };
    const bf16 = await resolveModelFile(`hf:${GGUF_REPO}:BF16`, common);
    expect(
      createHash('sha256')
        .update(await fs.readFile(bf16))
        .digest('hex'),
    ).toBe(fileSha256(GGUFS[1] as FakeFile));
    const latest = await resolveModelFile(`hf:${GGUF_REPO}`, common);
    expect(
      createHash('sha256')
        .update(await fs.readFile(latest))
        .digest('hex'),
    ).toBe(fileSha256(GGUFS[0] as FakeFile));
    const manifest = await fetch(`${hubUrl}/v2/${GGUF_REPO}/manifests/bf16`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect(await manifest.json()).toEqual({
      ggufFile: {
        rfilename: 'tiny-llama-BF16.gguf',
        blobId: `sha256:${fileSha256(GGUFS[1] as FakeFile)}`,
        size: GGUFS[1]?.size,
      },
    });
  });

  it('answers a quantisation the mirror lacks as the Hub does, and node-llama-cpp says so', async () => {
    const r = await fetch(`${hubUrl}/v2/${GGUF_REPO}/manifests/IQ2_XS`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([r.status, r.headers.get('x-error-code')]).toEqual([404, 'EntryNotFound']);
    const err = await resolveModelFile(`hf:${GGUF_REPO}:IQ2_XS`, {
      directory: t.dataDir,
      cli: false,
      endpoints: { huggingFace: `${hubUrl}/` },
      tokens: { huggingFace: hfToken },
    }).catch((e) => e);
    expect(String(err)).toMatch(/Cannot get quantization "IQ2_XS"/);
  });
});

describe('a repository mirrored at two commits', () => {
  const NEWER = '0123456789'.repeat(4);
  const changed: FakeFile = { path: 'config.json', head: json({ model_type: 'llama', vocab_size: 16 }), size: 0 };
  changed.size = changed.head.length;

  beforeAll(async () => {
    // The stand-in Hub moves main to a newer commit; the mirror fetches it as a second version.
    hub.repos.set(REPO, { id: REPO, sha: NEWER, files: [changed] });
    await mirrored('tiny-tok', NEWER.slice(0, 7), [
      { url: `${hub.url}/${REPO}/resolve/${NEWER}/config.json`, file: 'config.json', sha256: fileSha256(changed) },
    ]);
  }, 60_000);

  it('answers main with the commit mirrored last, and the older commit by its sha', async () => {
    const latest = await downloadFile({ repo: REPO, path: 'config.json', hubUrl, accessToken: hfToken });
    expect(Buffer.from(await (latest as Blob).arrayBuffer())).toEqual(changed.head);
    const info = await modelInfo({ name: REPO, hubUrl, accessToken: hfToken, additionalFields: ['sha', 'filePaths'] });
    expect([info.sha, info.filePaths]).toEqual([NEWER, ['config.json']]);
    const older = await downloadFile({
      repo: REPO,
      path: 'config.json',
      revision: COMMIT,
      hubUrl,
      accessToken: hfToken,
    });
    expect(Buffer.from(await (older as Blob).arrayBuffer())).toEqual(FILES[0]?.head);
    const head = await fetch(`${hubUrl}/${REPO}/resolve/${COMMIT}/model.safetensors`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([head.status, head.headers.get('x-repo-commit')]).toEqual([200, COMMIT]);
    expect(head.headers.get('cache-control')).toContain('immutable');
  });
});

describe('a file fetched from another origin under a Hub-shaped path (issue 26: /hf poisoning)', () => {
  const GGUF_REPO = 'acme/tiny-gguf';
  const REAL_COMMIT = 'b'.repeat(40);
  const MADE_UP = 'f00d'.repeat(10);
  const real: FakeFile = { path: 'model.gguf', head: bytes(3_000, 11), size: 3_000, lfs: true };
  let other: http.Server;
  let otherUrl: string;

  /** The attacker's fetch: no header check (fetchAnyway), as an operator may ask. */
  async function fetchAnyway(model: string, version: string, url: string | string[]) {
    const urls = Array.isArray(url) ? url : [url];
    const r = await t.gql(
      'mutation($m: String!, $v: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: $m, version: $v, sources: $s, fetchAnyway: true) { __typename ... on Error { message } } }',
      { m: model, v: version, s: urls.map((u) => ({ url: u, file: Array.isArray(url) ? undefined : 'model.gguf' })) },
      { token },
    );
    expect(r.data?.fetchToMirror.__typename, JSON.stringify(r)).toBe('FetchStarted');
    const end = Date.now() + 20_000;
    while ((await t.app.db.prisma.mirrorFile.count({ where: { model, version, state: 'PRESENT' } })) < urls.length) {
      if (Date.now() > end) throw new Error(`${model}/${version} did not arrive in the mirror`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  beforeAll(async () => {
    hub.repos.set(GGUF_REPO, { id: GGUF_REPO, sha: REAL_COMMIT, files: [real] });
    await fetchAnyway('tiny-gguf', 'bbbbbbb', `${hub.url}/${GGUF_REPO}/resolve/${REAL_COMMIT}/model.gguf`);
    // Another origin (a local HTTP server, allowed like the stand-in Hub) answers any path with 2 bytes.
    other = http.createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': 2 }).end('HI');
    });
    await new Promise<void>((r) => other.listen(0, '127.0.0.1', r));
    otherUrl = `http://127.0.0.1:${(other.address() as import('node:net').AddressInfo).port}`;
    // Fetched after the real one, so it is the newest row that names the repository.
    await fetchAnyway('poison', 'v1', `${otherUrl}/${GGUF_REPO}/resolve/${MADE_UP}/model.gguf`);
  }, 60_000);
  afterAll(() => new Promise<void>((r) => other.close(() => r())));

  it('does not speak for the repository: main serves the file fetched from the Hub, the made-up commit is not found', async () => {
    const blob = await downloadFile({ repo: GGUF_REPO, path: 'model.gguf', hubUrl, accessToken: hfToken });
    expect(Buffer.from(await (blob as Blob).arrayBuffer())).toEqual(real.head);
    const head = await fetch(`${hubUrl}/${GGUF_REPO}/resolve/main/model.gguf`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([head.status, head.headers.get('x-repo-commit'), head.headers.get('content-length')]).toEqual([
      200,
      REAL_COMMIT,
      '3000',
    ]);
    const info = await modelInfo({ name: GGUF_REPO, hubUrl, accessToken: hfToken, additionalFields: ['sha'] });
    expect(info.sha).toBe(REAL_COMMIT);
    const poisoned = await fetch(`${hubUrl}/${GGUF_REPO}/resolve/${MADE_UP}/model.gguf`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([poisoned.status, poisoned.headers.get('x-error-code')]).toEqual([404, 'RevisionNotFound']);
    // A repository only another origin answered for is not in the mirror at all, as far as /hf says.
    await fetchAnyway('poison', 'v2', `${otherUrl}/acme/only-elsewhere/resolve/${MADE_UP}/model.gguf`);
    const elsewhere = await fetch(`${hubUrl}/acme/only-elsewhere/resolve/main/model.gguf`, {
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([elsewhere.status, elsewhere.headers.get('x-error-code')]).toEqual([404, 'RepoNotFound']);
  });

  it("is not a repository's base weights for training either", async () => {
    await fetchAnyway(
      'poison-base',
      'v1',
      ['config.json', 'model.safetensors'].map((f) => `${otherUrl}/acme/base-model/resolve/${MADE_UP}/${f}`),
    );
    expect(await baseFilesFromMirror(t.app.db.prisma, t.app.services.mirror, 'acme/base-model')).toEqual([]);
  });

  it("is not taken from a Hub URL asked for by a sha256 the mirror holds: the Hub's own headers decide", async () => {
    // Another file's digest, claimed for the repository at a made-up commit on the Hub's origin: linking it
    // without asking the Hub would list those bytes as the repository's newest commit.
    const claimed = sha('model.safetensors');
    const r = await t.gql(
      'mutation($s: [MirrorSourceInput!]!) { fetchToMirror(model: "poison", version: "v3", sources: $s, fetchAnyway: true) { __typename ... on Error { message } } }',
      { s: [{ url: `${hub.url}/${GGUF_REPO}/resolve/${'0ff1ce'.repeat(6)}0ff1/model.gguf`, sha256: claimed }] },
      { token },
    );
    expect(r.data?.fetchToMirror.__typename, JSON.stringify(r)).toBe('FetchStarted');
    const end = Date.now() + 20_000;
    let row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'poison', version: 'v3' } });
    while (!['PRESENT', 'FAILED'].includes(row.state)) {
      if (Date.now() > end) throw new Error(`poison/v3 did not settle: ${row.state}`);
      await new Promise((r) => setTimeout(r, 50));
      row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'poison', version: 'v3' } });
    }
    expect([row.state, row.error]).toEqual(['FAILED', expect.stringMatching(/^sha256 mismatch/)]);
    const head = await fetch(`${hubUrl}/${GGUF_REPO}/resolve/main/model.gguf`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${hfToken}` },
    });
    expect([head.status, head.headers.get('x-repo-commit')]).toEqual([200, REAL_COMMIT]);
    // The Hub's own answer still saves the download: its headers publish the sha256, and the held copy is linked.
    await fetchAnyway('tiny-gguf-again', 'v1', `${hub.url}/${GGUF_REPO}/resolve/${REAL_COMMIT}/model.gguf`);
    const [again, held] = await Promise.all(
      ['tiny-gguf-again/v1', 'tiny-gguf/bbbbbbb'].map((v) => fs.stat(`${t.dataDir}/mirror/files/${v}/model.gguf`)),
    );
    expect(again?.ino).toBe(held?.ino);
  });

  describe('main is the commit the Hub named for it when the registry fetched it, with pull-through off', () => {
    const MOVING = 'acme/moving-main';
    const FILE = 'moving-Q4_K_M.gguf';
    const at = (seed: number): FakeFile => ({ path: FILE, head: bytes(2_000, seed), size: 2_000, lfs: true });
    const [A, B, C] = ['a1', 'b2', 'c3'].map((c) => c.repeat(20)) as [string, string, string];
    const [fileA, fileB, fileC] = [21, 22, 23].map(at) as [FakeFile, FakeFile, FakeFile];
    let viewer: string;

    /** fetchRepoSet as the console's explorer asks it: the repository's default branch, resolved by the registry. */
    async function fetchMain(version: string) {
      const r = await t.gql(
        `mutation { fetchRepoSet(repo: "${MOVING}", set: "model:moving-Q4_K_M", model: "moving", version: "${version}", force: true) { __typename ... on Error { message } } }`,
        {},
        { token },
      );
      expect(r.data?.fetchRepoSet.__typename, JSON.stringify(r)).toBe('FetchStarted');
      const end = Date.now() + 20_000;
      while ((await t.app.db.prisma.mirrorFile.count({ where: { model: 'moving', version, state: 'PRESENT' } })) < 1) {
        if (Date.now() > end) throw new Error(`moving/${version} did not arrive in the mirror`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }

    /** What `main` answers through /hf for this token: the file's sha256 (downloadFile) and the commit (modelInfo). */
    async function mainAnswers(accessToken: string) {
      const blob = await downloadFile({ repo: MOVING, path: FILE, hubUrl, accessToken });
      const info = await modelInfo({ name: MOVING, hubUrl, accessToken, additionalFields: ['sha'] });
      const got = Buffer.from(await (blob as Blob).arrayBuffer());
      return { sha256: createHash('sha256').update(got).digest('hex'), commit: info.sha };
    }

    beforeAll(async () => {
      viewer = `hf_${await t.token('VIEWER', 'moving-viewer')}`;
      hub.repos.set(MOVING, { id: MOVING, sha: A, files: [fileA] });
      await fetchMain('a');
      // A pull request's commit B on the same Hub, fetched by an operator by hand after main's: the Hub's main
      // still names A (the stand-in serves any revision's resolve with the files it holds, so it holds B's now).
      hub.repos.set(MOVING, { id: MOVING, sha: A, files: [fileB] });
      await fetchAnyway('moving-pr', 'pr1', `${hub.url}/${MOVING}/resolve/${B}/${FILE}`);
      hub.repos.set(MOVING, { id: MOVING, sha: A, files: [fileA] });
    }, 60_000);

    it('is not a newer commit fetched from the Hub by hand (a pull request’s): operators and viewers get A', async () => {
      for (const who of [hfToken, viewer])
        expect(await mainAnswers(who)).toEqual({ sha256: fileSha256(fileA), commit: A });
      // The pull request's commit is still served by its sha.
      const pr = await downloadFile({ repo: MOVING, path: FILE, revision: B, hubUrl, accessToken: viewer });
      expect(Buffer.from(await (pr as Blob).arrayBuffer())).toEqual(fileB.head);
    });

    it('moves when the Hub moves main and the registry fetches it again', async () => {
      hub.repos.set(MOVING, { id: MOVING, sha: C, files: [fileC] });
      await fetchMain('c');
      for (const who of [hfToken, viewer])
        expect(await mainAnswers(who)).toEqual({ sha256: fileSha256(fileC), commit: C });
    });

    it('stays at the commit the Hub named before while the new one is not in the mirror', async () => {
      const D = 'd4'.repeat(20);
      hub.repos.set(MOVING, { id: MOVING, sha: D, files: [at(24)] });
      // D's bytes never arrive: the Hub's CDN answers 2 bytes, and the file fails its sha256.
      hub.redirectLfs = () => `${otherUrl}/cdn/${FILE}`;
      try {
        const r = await t.gql(
          `mutation { fetchRepoSet(repo: "${MOVING}", set: "model:moving-Q4_K_M", model: "moving", version: "d", force: true) { __typename } }`,
          {},
          { token },
        );
        expect(r.data?.fetchRepoSet.__typename).toBe('FetchStarted');
        const end = Date.now() + 20_000;
        while (
          (await t.app.db.prisma.mirrorFile.count({ where: { model: 'moving', version: 'd', state: 'FAILED' } })) < 1
        ) {
          if (Date.now() > end) throw new Error('moving/d did not fail');
          await new Promise((r) => setTimeout(r, 50));
        }
      } finally {
        hub.redirectLfs = undefined;
      }
      expect(await mainAnswers(viewer)).toEqual({ sha256: fileSha256(fileC), commit: C });
    });
  });
});
