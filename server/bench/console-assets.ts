import fs from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { serveConsole } from '../src/http/static.js';

// The bytes a first visit to the console costs (index.html and every file of the built console under assets/),
// as sent plain, gzip and brotli, and how long a compressed file takes to answer once kept (the plain answer is
// the baseline, in the same process). Needs a built console: pnpm --filter @hangar/web build.
//   tsx bench/console-assets.ts [dist=../web/dist] [requests per file=50]

const dist = path.resolve(process.argv[2] ?? new URL('../../web/dist', import.meta.url).pathname);
const REPEAT = Number(process.argv[3] ?? 50);
const assets = await fs.readdir(path.join(dist, 'assets')).catch(() => null);
if (!assets) {
  console.log(`The console's first visit: skipped, no built console at ${dist} (pnpm --filter @hangar/web build)`);
  process.exit(0);
}
const files = ['/', ...assets.filter((f) => !f.endsWith('.map')).map((f) => `/assets/${f}`)];

const handler = serveConsole(dist);
const server = http.createServer((req, res) => void handler(req, res));
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
const port = (server.address() as { port: number }).port;
const agent = new http.Agent({ keepAlive: true });

function get(at: string, acceptEncoding?: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: at,
        agent,
        headers: acceptEncoding ? { 'accept-encoding': acceptEncoding } : {},
      },
      (res) => {
        let n = 0;
        res.on('data', (c: Buffer) => (n += c.length));
        res.on('end', () => resolve(n));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

// The first compressed request waits for the kept copies (made in the background as the handler was built).
const started = performance.now();
for (const f of files) await get(f, 'br');
const firstMs = performance.now() - started;

const sent: Record<string, number> = {};
for (const enc of ['identity', 'gzip', 'br']) {
  sent[enc] = 0;
  for (const f of files) sent[enc] += await get(f, enc);
}
const timing: Record<string, number> = { identity: 0, br: 0 };
for (let round = 0; round < 3; round++) {
  for (const enc of round % 2 ? ['br', 'identity'] : ['identity', 'br']) {
    const t0 = performance.now();
    for (let i = 0; i < REPEAT; i++) for (const f of files) await get(f, enc);
    timing[enc] = (timing[enc] ?? 0) + (performance.now() - t0) / (3 * REPEAT);
  }
}

const kb = (n = 0) => `${(n / 1024).toFixed(1)} KB`;
console.log(`The console's first visit: ${files.length} files from ${dist}`);
console.log(
  `  sent plain ${kb(sent.identity)}, gzip ${kb(sent.gzip)} (${((sent.gzip ?? 0) / (sent.identity ?? 1)).toFixed(2)}×), brotli ${kb(sent.br)} (${((sent.br ?? 0) / (sent.identity ?? 1)).toFixed(2)}×)`,
);
console.log(
  `  all files once: plain ${timing.identity?.toFixed(2)} ms, brotli (kept) ${timing.br?.toFixed(2)} ms (${((timing.br ?? 0) / (timing.identity ?? 1)).toFixed(2)}× plain); the very first brotli pass ${firstMs.toFixed(0)} ms`,
);
agent.destroy();
server.close();
