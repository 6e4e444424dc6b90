import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import { promisify } from 'node:util';
import { bytes, sha256 } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { parseRange } from './serve.js';

describe('parseRange (RFC 9110 §14.1.2)', () => {
  it.each([
    ['bytes=0-0', { start: 0, end: 0 }],
    ['bytes=0-', { start: 0, end: 999 }],
    ['bytes=-500', { start: 500, end: 999 }],
    ['bytes=-5000', { start: 0, end: 999 }],
    ['bytes=990-5000', { start: 990, end: 999 }],
    ['bytes=1000-', 'unsatisfiable'],
    ['bytes=-0', 'unsatisfiable'],
    ['bytes=0-1,5-6', 'multiple'],
    ['bytes=5-1', 'ignore'],
    ['items=0-1', 'ignore'],
    [undefined, 'ignore'],
  ] as const)('%s', (header, expected) => {
    expect(parseRange(header, 1000)).toEqual(expected);
  });
});

describe('serving mirror files', () => {
  let t: TestApp;
  let base: string;
  let operator: string;
  const body = bytes(1_000_000, 42);
  const digest = sha256(body);
  const fileUrl = () => `${base}/mirror/served/v1/weights.gguf`;

  beforeAll(async () => {
    t = await startTestApp();
    base = await t.app.start();
    operator = await t.token('OPERATOR', 'uploader');
    const put = await fetch(fileUrl(), {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}`, 'x-content-sha256': digest },
      body: new Uint8Array(body),
    });
    expect(put.status).toBe(201);
    expect(await put.json()).toEqual({ url: fileUrl(), sha256: digest, size: body.length });
  });
  afterAll(() => t.close());

  // The mirror asks for a credential by default (HANGAR_MIRROR_REQUIRE_TOKEN): these read as a node or script would.
  const get = (headers: Record<string, string> = {}, method = 'GET') =>
    fetch(fileUrl(), { method, headers: { authorization: `Bearer ${operator}`, ...headers } });

  it('serves the whole file with its sha256 as ETag', async () => {
    const r = await get();
    expect(r.status).toBe(200);
    expect(r.headers.get('etag')).toBe(`"${digest}"`);
    expect(r.headers.get('accept-ranges')).toBe('bytes');
    expect(r.headers.get('content-length')).toBe(String(body.length));
    expect(sha256(Buffer.from(await r.arrayBuffer()))).toBe(digest);
  });

  it('answers HEAD with the headers and no body', async () => {
    const r = await get({}, 'HEAD');
    expect(r.status).toBe(200);
    expect(r.headers.get('content-length')).toBe(String(body.length));
    expect((await r.arrayBuffer()).byteLength).toBe(0);
  });

  it('serves single ranges, the first byte and the last 500', async () => {
    const first = await get({ range: 'bytes=0-0' });
    expect(first.status).toBe(206);
    expect(first.headers.get('content-range')).toBe(`bytes 0-0/${body.length}`);
    expect(Buffer.from(await first.arrayBuffer())).toEqual(body.subarray(0, 1));
    const tail = await get({ range: 'bytes=-500' });
    expect(tail.headers.get('content-range')).toBe(`bytes ${body.length - 500}-${body.length - 1}/${body.length}`);
    expect(Buffer.from(await tail.arrayBuffer())).toEqual(body.subarray(body.length - 500));
  });

  it('answers 416 with bytes */size past the end, and refuses several ranges', async () => {
    const past = await get({ range: `bytes=${body.length}-` });
    expect(past.status).toBe(416);
    expect(past.headers.get('content-range')).toBe(`bytes */${body.length}`);
    const two = await get({ range: 'bytes=0-1,10-11' });
    expect(two.status).toBe(416);
    expect(await two.text()).toMatch(/one byte range per request/);
  });

  it('sends the whole file when If-Range names another version', async () => {
    const stale = await get({ range: 'bytes=0-9', 'if-range': `"${'0'.repeat(64)}"` });
    expect(stale.status).toBe(200);
    const fresh = await get({ range: 'bytes=0-9', 'if-range': `"${digest}"` });
    expect(fresh.status).toBe(206);
  });

  it('gives curl, fetching in ranges, the same bytes', async () => {
    const out = `${t.dataDir}/curl-parts`;
    const half = body.length / 2;
    // Not execFileSync: the server answering curl runs in this very process.
    const run = promisify(execFile);
    const auth = ['-H', `Authorization: Bearer ${operator}`];
    await run('curl', ['-sf', ...auth, '-r', `0-${half - 1}`, '-o', `${out}.1`, fileUrl()]);
    await run('curl', ['-sf', ...auth, '-r', `${half}-`, '-o', `${out}.2`, fileUrl()]);
    const joined = Buffer.concat([await fs.readFile(`${out}.1`), await fs.readFile(`${out}.2`)]);
    expect(sha256(joined)).toBe(digest);
  });

  it('lists a version’s present files with their size and sha256, for a node fetching a set whole', async () => {
    const config = Buffer.from('{"architectures":["LlamaForCausalLM"]}');
    const shard = bytes(5000, 7);
    for (const [file, b] of [
      ['config.json', config],
      ['sub/model.safetensors', shard],
    ] as const) {
      const put = await fetch(`${base}/mirror/set/v1/${file}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${operator}` },
        body: new Uint8Array(b),
      });
      expect(put.status).toBe(201);
    }
    const list = await fetch(`${base}/mirror/set/v1/`, { headers: { authorization: `Bearer ${operator}` } });
    expect(list.status).toBe(200);
    expect(list.headers.get('content-type')).toBe('application/json');
    expect(await list.json()).toEqual({
      model: 'set',
      version: 'v1',
      complete: true,
      files: [
        { name: 'config.json', size: config.length, sha256: sha256(config) },
        { name: 'sub/model.safetensors', size: shard.length, sha256: sha256(shard) },
      ],
    });
    // A file that is not present (failed, still fetching) is left out, and the set is said to be incomplete.
    await t.app.db.prisma.mirrorFile.updateMany({
      where: { model: 'set', version: 'v1', file: 'config.json' },
      data: { state: 'FAILED' },
    });
    const partial = await (
      await fetch(`${base}/mirror/set/v1/`, { headers: { authorization: `Bearer ${operator}` } })
    ).json();
    expect(partial).toMatchObject({ complete: false, files: [{ name: 'sub/model.safetensors' }] });
    const missing = await fetch(`${base}/mirror/set/v9/`, { headers: { authorization: `Bearer ${operator}` } });
    expect(missing.status).toBe(404);
    expect(await missing.text()).toBe('no such version in the mirror\n');
    // The same credential as the files (HANGAR_MIRROR_REQUIRE_TOKEN).
    expect((await fetch(`${base}/mirror/set/v1/`)).status).toBe(401);
  });

  it('refuses an upload whose bytes do not match, keeps nothing, and audits it', async () => {
    const r = await fetch(`${base}/mirror/served/v2/bad.gguf`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}`, 'x-content-sha256': 'f'.repeat(64) },
      body: new Uint8Array(bytes(1000, 1)),
    });
    expect(r.status).toBe(400);
    expect((await r.json()).error).toMatch(/^sha256 mismatch/);
    expect(
      (await fetch(`${base}/mirror/served/v2/bad.gguf`, { headers: { authorization: `Bearer ${operator}` } })).status,
    ).toBe(404);
    const audit = await t.app.db.prisma.auditEvent.findFirst({
      where: { action: 'uploadToMirror' },
      orderBy: { id: 'desc' },
    });
    expect(audit).toMatchObject({ outcome: 'REFUSED', target: 'served/v2/bad.gguf' });
  });

  it('audits every refused upload of a caller with a credential, a NUL or a newline in the name escaped', async () => {
    const viewer = await t.token('VIEWER', 'nul-viewer');
    const refusals = [
      // A NUL is refused at the edge, before any route, and audited there, still percent-encoded.
      { path: 'served/v9/a%00b.gguf', token: operator, status: 400 },
      // A newline or another control character reaches the name rules, and is escaped in the audit row.
      { path: 'served/v9/line%0Abreak.gguf', token: operator, status: 400 },
      { path: 'served/v9/viewer%01.gguf', token: viewer, status: 403 },
      // Not percent-encoding at all.
      { path: 'served/v9/%E0%A4%A.gguf', token: operator, status: 400 },
    ];
    for (const r of refusals) {
      const before = await t.app.db.prisma.auditEvent.count({ where: { action: 'uploadToMirror' } });
      const res = await fetch(`${base}/mirror/${r.path}`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${r.token}` },
        body: 'x',
      });
      expect(res.status, r.path).toBe(r.status);
      const rows = await t.app.db.prisma.auditEvent.findMany({
        where: { action: 'uploadToMirror' },
        orderBy: { id: 'desc' },
        take: 1,
      });
      expect(await t.app.db.prisma.auditEvent.count({ where: { action: 'uploadToMirror' } }), r.path).toBe(before + 1);
      expect(rows[0]?.outcome).toBe('REFUSED');
      expect([...(rows[0]?.target ?? '')].some((c) => c.charCodeAt(0) < 0x20)).toBe(false);
    }
    const target = async (contains: string) =>
      (
        await t.app.db.prisma.auditEvent.findFirstOrThrow({
          where: { action: 'uploadToMirror', target: { contains } },
          orderBy: { id: 'desc' },
        })
      ).target;
    expect(await target('a%00b')).toMatch(/served\/v9\/a%00b\.gguf$/);
    expect(await target('line')).toBe('served/v9/line\\u000abreak.gguf');
    expect(await target('viewer')).toBe('served/v9/viewer\\u0001.gguf');
    expect(await target('%E0')).toBe('served/v9/%E0%A4%A.gguf');
  });

  it('refuses an upload from a viewer or without a token', async () => {
    const viewer = await t.token('VIEWER', 'looker');
    expect(
      (
        await fetch(`${base}/mirror/x/v1/a.bin`, {
          method: 'PUT',
          headers: { authorization: `Bearer ${viewer}` },
          body: 'x',
        })
      ).status,
    ).toBe(403);
    expect((await fetch(`${base}/mirror/x/v1/a.bin`, { method: 'PUT', body: 'x' })).status).toBe(401);
  });

  it('marks a present file cut short on disk (a crash before writeback) failed at the next start', async () => {
    const put = await fetch(`${base}/mirror/served/v3/short.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: new Uint8Array(body),
    });
    expect(put.status).toBe(201);
    await fs.truncate(`${t.dataDir}/mirror/files/served/v3/short.bin`, 4096);
    await t.restart();
    base = await t.app.start();
    operator = await t.token('OPERATOR', 'uploader-again');
    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'served', file: 'short.bin' } });
    expect(row).toMatchObject({ state: 'FAILED', bytesDone: 0n });
    expect(row.error).toBe(
      'the file on disk is 4096 bytes, not the 1000000 verified (the machine stopped before they reached the disk?): ' +
        'retry fetches it again',
    );
    expect(
      (await fetch(`${base}/mirror/served/v3/short.bin`, { headers: { authorization: `Bearer ${operator}` } })).status,
    ).toBe(404);
    // The whole file next to it is untouched.
    expect((await get()).status).toBe(200);
  });

  it('does not serve a file that was deleted by hand, and marks it failed at the next start', async () => {
    await fs.rm(`${t.dataDir}/mirror/files/served/v1/weights.gguf`);
    expect((await get()).status).toBe(404);
    await t.restart();
    base = await t.app.start();
    const row = await t.app.db.prisma.mirrorFile.findFirstOrThrow({ where: { model: 'served', file: 'weights.gguf' } });
    expect(row.state).toBe('FAILED');
    expect(row.error).toMatch(/no longer on disk/);
  });
});

describe('a mirror that requires a token (the default)', () => {
  it('refuses anonymous downloads, serves tokens, and still lets the server check a source before serving it', async () => {
    const t = await startTestApp();
    const base = await t.app.start();
    const operator = await t.token('OPERATOR', 'private-mirror');
    const body = await fs.readFile(
      new URL('../../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
    );
    const put = await fetch(`${base}/mirror/priv/v1/model.gguf`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: new Uint8Array(body),
    });
    expect(put.status).toBe(201);
    const anonymous = await fetch(`${base}/mirror/priv/v1/model.gguf`, { method: 'HEAD' });
    expect(anonymous.status).toBe(401);
    const withToken = await fetch(`${base}/mirror/priv/v1/model.gguf`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${operator}` },
    });
    expect(withToken.status).toBe(200);
    // The console downloads with its session, as a browser sends it.
    const { cookie } = await t.login();
    const withSession = await fetch(`${base}/mirror/priv/v1/model.gguf`, { method: 'HEAD', headers: { cookie } });
    expect(withSession.status).toBe(200);
    const served = await t.gql(
      'mutation { serveMirrorVersion(model: "priv", version: "v1") { __typename ... on Error { message } } }',
      {},
      { token: operator },
    );
    expect(served.data?.serveMirrorVersion.__typename).toBe('ServePlaced');
    await t.close();
  });
});

describe('a mirror opened to anonymous callers (HANGAR_MIRROR_REQUIRE_TOKEN=false)', () => {
  it('serves files without a credential, as an air-gapped site may choose', async () => {
    const t = await startTestApp({ HANGAR_MIRROR_REQUIRE_TOKEN: 'false' });
    const base = await t.app.start();
    const operator = await t.token('OPERATOR', 'open-mirror');
    const body = bytes(4096, 3);
    const put = await fetch(`${base}/mirror/open/v1/a.bin`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${operator}` },
      body: new Uint8Array(body),
    });
    expect(put.status).toBe(201);
    const anonymous = await fetch(`${base}/mirror/open/v1/a.bin`);
    expect(anonymous.status).toBe(200);
    expect(sha256(Buffer.from(await anonymous.arrayBuffer()))).toBe(sha256(body));
    await t.close();
  });
});
