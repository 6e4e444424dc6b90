import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { precompress } from '../../web/scripts/precompress.mjs';
import { serveConsole } from '../src/http/static.js';

// The console's assets are compressed when the console is built (web/scripts/precompress.mjs, a Vite plugin)
// and the server sends those bytes as they are, over a real socket; a copy older than its file is not trusted.

const TEXT = `${'export const row = "a table row of the mirror page";\n'.repeat(400)}`;
let dist: string;
let url: string;
let server: http.Server | undefined;

function get(at: string, encoding?: string) {
  return new Promise<{ headers: http.IncomingHttpHeaders; body: Buffer }>((resolve, reject) => {
    const req = http.get(`${url}${at}`, { headers: encoding ? { 'accept-encoding': encoding } : {} }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
  });
}

const decode = (r: { headers: http.IncomingHttpHeaders; body: Buffer }) =>
  r.headers['content-encoding'] === 'br'
    ? zlib.brotliDecompressSync(r.body).toString()
    : r.headers['content-encoding'] === 'gzip'
      ? zlib.gunzipSync(r.body).toString()
      : r.body.toString();

beforeAll(async () => {
  dist = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-console-assets-'));
  await fs.mkdir(path.join(dist, 'assets'));
  await fs.writeFile(path.join(dist, 'index.html'), '<!doctype html><title>Hangar</title>');
  await fs.writeFile(path.join(dist, 'assets', 'app-1a2b.js'), TEXT);
  await fs.writeFile(path.join(dist, 'assets', 'app-1a2b.js.map'), TEXT);
  await fs.writeFile(path.join(dist, 'assets', 'tiny-3c4d.js'), 'console.log(1)');
  await fs.writeFile(path.join(dist, 'assets', 'stale-5e6f.js'), TEXT);
});

afterAll(async () => {
  await new Promise((r) => (server ? server.close(r) : r(undefined)));
  await fs.rm(dist, { recursive: true, force: true });
});

describe("the console's build", () => {
  it('writes brotli and gzip copies of each text file worth compressing, and of nothing else', async () => {
    const done = (await precompress(dist)).sort();
    expect(done).toEqual(['assets/app-1a2b.js', 'assets/stale-5e6f.js']);
    const br = await fs.readFile(path.join(dist, 'assets', 'app-1a2b.js.br'));
    const gz = await fs.readFile(path.join(dist, 'assets', 'app-1a2b.js.gz'));
    expect(zlib.brotliDecompressSync(br).toString()).toBe(TEXT);
    expect(zlib.gunzipSync(gz).toString()).toBe(TEXT);
    expect(br.length).toBeLessThan(TEXT.length / 10);
  });
});

describe('the server', () => {
  // Copies that say something else than the file: only sending them as they are shows this.
  const marker = 'built at build time';
  beforeAll(async () => {
    await fs.writeFile(path.join(dist, 'assets', 'app-1a2b.js.br'), zlib.brotliCompressSync(marker));
    await fs.writeFile(path.join(dist, 'assets', 'app-1a2b.js.gz'), zlib.gzipSync(marker));
    // Rebuilt after its copies were written: they describe the file before.
    await fs.writeFile(path.join(dist, 'assets', 'stale-5e6f.js.br'), zlib.brotliCompressSync('old bytes'));
    await fs.writeFile(path.join(dist, 'assets', 'stale-5e6f.js.gz'), zlib.gzipSync('old bytes'));
    const later = new Date(Date.now() + 60_000);
    await fs.utimes(path.join(dist, 'assets', 'stale-5e6f.js'), later, later);
    // As at a start: the server finds the build as it is.
    server = http.createServer(serveConsole(dist, { imageSources: [] }));
    const s = server;
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
  });

  it("sends the build's copies as they are, with a year's cache for a hashed file", async () => {
    for (const encoding of ['br', 'gzip']) {
      const r = await get('/assets/app-1a2b.js', encoding);
      expect(r.headers['content-encoding']).toBe(encoding);
      expect(r.headers['cache-control']).toBe('public, max-age=31536000, immutable');
      expect(r.headers.vary).toMatch(/accept-encoding/i);
      expect(decode(r)).toBe(marker);
    }
    const plain = await get('/assets/app-1a2b.js');
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.body.toString()).toBe(TEXT);
    expect((await get('/', 'br')).headers['cache-control']).toBe('no-cache');
  });

  it('compresses a file itself when its copies are older than it (rebuilt without them)', async () => {
    const r = await get('/assets/stale-5e6f.js', 'br');
    expect(r.headers['content-encoding']).toBe('br');
    expect(decode(r)).toBe(TEXT);
  });
});
