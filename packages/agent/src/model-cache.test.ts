import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ModelCache, ModelCacheError } from './model-cache.js';

// The mirror here is the fault-injecting stand-in over a real socket: it answers Range and sends the file's
// sha256 as its ETag, as /mirror/… does.

let up: Upstream;
let dir: string;
const body = bytes(3 << 20, 7);

beforeAll(async () => {
  up = await startUpstream();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cache-'));
});
afterAll(async () => {
  await up.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const fresh = async () => new ModelCache(await fs.mkdtemp(path.join(dir, 'c-')), { backoffMs: 10, stallMs: 2000 });
const listing = (c: ModelCache) => fs.readdir(c.modelsDir);

describe('ModelCache', () => {
  it('resumes with Range after a reset mid-body, verifies, and reuses the file next time', async () => {
    up.files.set('reset.gguf', { body, fault: { kind: 'reset', afterBytes: 1 << 20, times: 1 } });
    const cache = await fresh();
    const got = await cache.fetch(up.url('reset.gguf'));
    expect(got).toMatchObject({ sha256: sha256(body), bytes: body.length, reused: false });
    expect(got.file).toBe(path.join(cache.modelsDir, `${sha256(body)}.gguf`));
    expect(sha256(await fs.readFile(got.file))).toBe(sha256(body));
    const asked = up.requests.filter((r) => r.name === 'reset.gguf');
    expect(asked[0]).toMatchObject({ range: undefined, status: 200 });
    expect(asked[1]?.range).toMatch(/^bytes=\d+-$/);
    expect(Number(asked[1]?.range?.match(/\d+/)?.[0])).toBeGreaterThan(0);
    expect(asked[1]).toMatchObject({ ifRange: `"${sha256(body)}"`, status: 206 });
    expect(await listing(cache)).toEqual([`${sha256(body)}.gguf`]);

    const again = await cache.fetch(up.url('reset.gguf'));
    expect(again).toMatchObject({ file: got.file, reused: true });
  });

  it('resumes a part file left by an earlier run', async () => {
    up.files.set('left.gguf', { body });
    const cache = await fresh();
    await fs.mkdir(cache.modelsDir, { recursive: true });
    await fs.writeFile(path.join(cache.modelsDir, `${sha256(body)}.gguf.part`), body.subarray(0, 1000));
    const got = await cache.fetch(up.url('left.gguf'));
    expect(sha256(await fs.readFile(got.file))).toBe(sha256(body));
    expect(up.requests.filter((r) => r.name === 'left.gguf').at(-1)).toMatchObject({
      range: 'bytes=1000-',
      status: 206,
    });
  });

  it('counts a silent transfer as stalled and resumes it', async () => {
    up.files.set('stall.gguf', { body, fault: { kind: 'stall', afterBytes: 64 << 10, times: 1 } });
    const cache = new ModelCache(await fs.mkdtemp(path.join(dir, 'c-')), { backoffMs: 10, stallMs: 300 });
    const got = await cache.fetch(up.url('stall.gguf'));
    expect(sha256(await fs.readFile(got.file))).toBe(sha256(body));
    expect(up.requests.filter((r) => r.name === 'stall.gguf').at(-1)?.status).toBe(206);
  });

  it('fails on a wrong sha256 and keeps nothing', async () => {
    up.files.set('wrong.gguf', { body, fault: { kind: 'wrong-bytes' } });
    const cache = await fresh();
    const err = await cache.fetch(up.url('wrong.gguf')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ModelCacheError);
    expect((err as Error).message).toMatch(
      new RegExp(`sha256 is [0-9a-f]{64}, but the mirror says ${sha256(body)}.*not kept`),
    );
    expect(await listing(cache)).toEqual([]);
  });

  it('fetches a file again when the cached copy no longer matches', async () => {
    up.files.set('again.gguf', { body: bytes(4096, 3) });
    const cache = await fresh();
    const first = await cache.fetch(up.url('again.gguf'));
    await fs.writeFile(first.file, 'damaged');
    const second = await cache.fetch(up.url('again.gguf'));
    expect(second.reused).toBe(false);
    expect(await fs.readFile(second.file)).toEqual(bytes(4096, 3));
  });

  it("sends the node token to the control plane's own mirror only", async () => {
    const seen: string[] = [];
    const file = bytes(1000, 5);
    const mirror = http.createServer((req, res) => {
      seen.push(`${req.method} ${req.headers.authorization}`);
      res.writeHead(200, { etag: `"${sha256(file)}"`, 'content-length': file.length }).end(file);
    });
    await new Promise<void>((r) => mirror.listen(0, '127.0.0.1', r));
    const { port } = mirror.address() as AddressInfo;
    const cache = new ModelCache(await fs.mkdtemp(path.join(dir, 'c-')), {
      auth: { origin: `http://127.0.0.1:${port}`, token: 'hgn_node' },
    });
    await cache.fetch(`http://127.0.0.1:${port}/mirror/m/v/a.gguf`);
    await cache.fetch(`http://localhost:${port}/elsewhere/a.gguf`);
    mirror.close();
    // The mirror's HEAD (its sha256, asked first: see download()) and GET carry it; another origin's GET does not.
    expect(seen).toEqual(['HEAD Bearer hgn_node', 'GET Bearer hgn_node', 'GET undefined']);
  });

  it('fetches every shard of a split model and links them by name beside the first', async () => {
    const parts = [bytes(3000, 11), bytes(2000, 12), bytes(1000, 13)];
    parts.forEach((body, i) => {
      up.files.set(`big-0000${i + 1}-of-00003.gguf`, { body });
    });
    const cache = await fresh();
    const got = await cache.fetchModel(up.url('big-00001-of-00003.gguf'));
    expect(got).toMatchObject({ sha256: sha256(parts[0]!), bytes: 6000, shards: 3, reused: false });
    expect(path.basename(got.file)).toBe('big-00001-of-00003.gguf');
    for (const [i, body] of parts.entries()) {
      const beside = path.join(path.dirname(got.file), `big-0000${i + 1}-of-00003.gguf`);
      expect(sha256(await fs.readFile(beside))).toBe(sha256(body));
    }
    expect((await cache.fetchModel(up.url('big-00001-of-00003.gguf'))).reused).toBe(true);
    await expect(cache.fetchModel(up.url('big-00002-of-00003.gguf'))).rejects.toThrow(/shard 2 of 3/);
  });

  it('says why when the mirror refuses or gives no sha256', async () => {
    const cache = await fresh();
    await expect(cache.fetch(up.url('absent.gguf'))).rejects.toThrow(/answered 404: \{"error":"Entry not found"\}/);
    up.files.set('nodigest.gguf', { body: bytes(100), noDigest: true });
    await expect(cache.fetch(up.url('nodigest.gguf'))).rejects.toThrow(/did not give the file's sha256 as its ETag/);
  });

  it('fetches a version’s set whole into one directory of links by name, each verified; reused, and shared', async () => {
    const files = {
      'config.json': Buffer.from('{"architectures":["LlamaForCausalLM"]}'),
      'sub/w.safetensors': bytes(9000, 21),
    };
    const at = publishSet('set/v1/', files);
    const cache = await fresh();
    const fetched = () => up.requests.filter((r) => r.name.startsWith('set/v1/') && r.name !== 'set/v1/').length;
    // Two replicas asking at once share one fetch: each file is asked for once.
    const [got, same] = await Promise.all([cache.fetchDir(at), cache.fetchDir(at)]);
    expect(same).toBe(got);
    expect(got).toMatchObject({ files: 2, bytes: 9000 + files['config.json'].length, reused: false });
    expect(fetched()).toBe(2);
    for (const [name, body] of Object.entries(files)) {
      expect(sha256(await fs.readFile(path.join(got.dir, name)))).toBe(sha256(body));
      expect((await fs.lstat(path.join(got.dir, name))).isSymbolicLink()).toBe(true);
    }
    // Already there: checked again on disk, the mirror only asked for the listing.
    expect(await cache.fetchDir(at)).toEqual({ ...got, reused: true });
    expect(fetched()).toBe(2);
    // A file changed on disk since (a disk fault, a hand) is fetched again, not handed over.
    const blob = path.join(cache.modelsDir, `${sha256(files['sub/w.safetensors'])}.gguf`);
    await fs.writeFile(blob, 'not the weights');
    expect((await cache.fetchDir(at)).reused).toBe(false);
    expect(sha256(await fs.readFile(path.join(got.dir, 'sub/w.safetensors')))).toBe(sha256(files['sub/w.safetensors']));
    expect(fetched()).toBe(3);
  });

  it('hands over no directory for a set with a file that does not verify, or one the mirror holds only part of', async () => {
    const cache = await fresh();
    const at = publishSet('bad/v1/', { 'config.json': Buffer.from('{}'), 'w.safetensors': bytes(5000, 22) });
    up.files.set('bad/v1/w.safetensors', { body: bytes(5000, 22), fault: { kind: 'wrong-bytes' } });
    await expect(cache.fetchDir(at)).rejects.toThrow(/the bytes were changed on the way/);
    // Nothing in sets/: not a directory with config.json and no weights.
    expect(await fs.readdir(path.join(cache.dir, 'sets')).catch(() => [])).toEqual([]);

    const part = publishSet('part/v1/', { 'config.json': Buffer.from('{}') }, false);
    await expect(cache.fetchDir(part)).rejects.toThrow(/the mirror holds only part of this version \(1 files verified/);
    await expect(cache.fetchDir(up.url('part/v1/config.json'))).rejects.toThrow(/is not a mirror version/);
    await expect(cache.fetchDir(setUrl('none/v1/'))).rejects.toThrow(/answered 404 to the version's listing/);
    up.files.set('evil/v1/', {
      body: Buffer.from(
        JSON.stringify({ complete: true, files: [{ name: '../../x', size: 1, sha256: 'a'.repeat(64) }] }),
      ),
    });
    await expect(cache.fetchDir(setUrl('evil/v1/'))).rejects.toThrow(/is not a relative path inside the version/);
  });
});

/** A version as the mirror lists it (GET /mirror/<model>/<version>/) with its files; returns the version's URL. */
function publishSet(version: string, files: Record<string, Buffer>, complete = true) {
  for (const [name, body] of Object.entries(files)) up.files.set(`${version}${name}`, { body });
  const listed = Object.entries(files).map(([name, body]) => ({ name, size: body.length, sha256: sha256(body) }));
  up.files.set(version, { body: Buffer.from(JSON.stringify({ complete, files: listed })) });
  return setUrl(version);
}

/** A version's URL ends in `/`, as the mirror's does (the upstream's url() would escape it). */
const setUrl = (version: string) => `${up.url(version.slice(0, -1))}/`;
