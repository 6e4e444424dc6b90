import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Hub } from './hub.js';

// A repository's config.json and README.md are files anyone can push: one of gigabytes (or a server that never
// stops sending) must cost Hangar the cap, not the whole body held in memory.

let server: http.Server;
let url: string;
const sent = new Map<string, number>();

beforeAll(async () => {
  server = http.createServer((req, res) => {
    const path = req.url ?? '';
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    const chunk = Buffer.alloc(64 * 1024, path.endsWith('README.md') ? 'a' : ' ');
    let total = 0;
    // Endless: only the client's closing the connection ends it.
    const pump = () => {
      while (res.write(chunk)) {
        total += chunk.length;
        sent.set(path, total);
        if (total > 256 * 2 ** 20) return res.end();
      }
      res.once('drain', pump);
    };
    res.on('close', () => sent.set(path, total));
    pump();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

describe('the Hub client reads a file only up to its cap', () => {
  const hub = () => new Hub({ hubUrl: url, timeoutMs: 20_000 });

  it('answers no config for an endless config.json, having read little of it', async () => {
    expect(await hub().config('org/huge', 'main')).toBeNull();
    expect(sent.get('/org/huge/resolve/main/config.json') ?? 0).toBeLessThan(32 * 2 ** 20);
  });

  it('cuts an endless README.md at 512 KiB', async () => {
    const text = await hub().readme('org/huge', 'main');
    expect(text?.length).toBe(512 * 1024);
    expect(sent.get('/org/huge/resolve/main/README.md') ?? 0).toBeLessThan(32 * 2 ** 20);
  });
});
