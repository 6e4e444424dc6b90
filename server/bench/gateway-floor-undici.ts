import http from 'node:http';
import type { AddressInfo } from 'node:net';
import v8 from 'node:v8';
import vm from 'node:vm';
import { Pool } from 'undici';

// gateway-floor.ts with undici's Pool for the upstream instead of node:http's Agent: the same bare reverse proxy
// (no callers, names, routing, taps or usage), so that the two floors side by side in bench/gateway.ts
// (HANGAR_BENCH_UNDICI=1) say which HTTP client costs less per proxied request before the gateway is moved to it.
// HANGAR_BENCH_UNDICI_API picks undici's API: `request` (a promise and a body stream per request, what the gateway
// would use in place of http.request) or `dispatch` (its handler callbacks, the least undici does per request).
//
// The engine's endpoint and key come in HANGAR_BENCH_ENGINE / HANGAR_BENCH_ENGINE_KEY; the bound URL goes back over
// IPC; {count: 'usage'} is answered with this process's memory (after a full GC) and CPU time so far.

const engine = new URL(process.env.HANGAR_BENCH_ENGINE ?? '');
const key = process.env.HANGAR_BENCH_ENGINE_KEY ?? '';
const api = process.env.HANGAR_BENCH_UNDICI_API === 'dispatch' ? 'dispatch' : 'request';
// As many connections as the client opens (node:http's agent has no cap either); pipelining off, as an engine
// answers one request per connection at a time.
const pool = new Pool(engine.origin, { connections: null, pipelining: 1, keepAliveTimeout: 60_000 });
const prefix = engine.pathname.replace(/\/+$/, '');

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.once('end', () => resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks)));
    req.once('error', reject);
  });
}

const headersFor = (req: http.IncomingMessage, body: Buffer) => ({
  'content-type': req.headers['content-type'] ?? 'application/json',
  'content-length': String(body.length),
  authorization: `Bearer ${key}`,
});

async function viaRequest(req: http.IncomingMessage, res: http.ServerResponse) {
  const body = await readBody(req);
  const abort = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  try {
    const answer = await pool.request({
      path: `${prefix}${(req.url ?? '/').replace(/^\/v1/, '')}`,
      method: 'POST',
      headers: headersFor(req, body),
      body,
      signal: abort.signal,
    });
    const headers: Record<string, string> = {
      'content-type': String(answer.headers['content-type'] ?? 'text/plain'),
    };
    if (answer.headers['content-length']) headers['content-length'] = String(answer.headers['content-length']);
    res.writeHead(answer.statusCode, headers);
    answer.body.on('data', (chunk: Buffer) => {
      if (!res.write(chunk)) {
        answer.body.pause();
        res.once('drain', () => answer.body.resume());
      }
    });
    answer.body.once('end', () => res.end());
    answer.body.once('error', () => res.destroy());
  } catch {
    res.destroy();
  }
}

async function viaDispatch(req: http.IncomingMessage, res: http.ServerResponse) {
  const body = await readBody(req);
  let abort: ((err: Error) => void) | undefined;
  res.on('close', () => {
    if (!res.writableFinished) abort?.(new Error('the client went away'));
  });
  let resume: (() => void) | undefined;
  res.on('drain', () => resume?.());
  pool.dispatch(
    {
      path: `${prefix}${(req.url ?? '/').replace(/^\/v1/, '')}`,
      method: 'POST',
      headers: headersFor(req, body),
      body,
    },
    {
      onConnect(a: (err: Error) => void) {
        abort = a;
      },
      onHeaders(status: number, raw: Buffer[], r: () => void) {
        resume = r;
        const headers: Record<string, string> = {};
        for (let i = 0; i < raw.length; i += 2) {
          const name = (raw[i] as Buffer).toString('latin1').toLowerCase();
          if (name === 'content-type' || name === 'content-length')
            headers[name] = (raw[i + 1] as Buffer).toString('latin1');
        }
        res.writeHead(status, headers);
        return true;
      },
      onData(chunk: Buffer) {
        return res.write(chunk);
      },
      onComplete() {
        res.end();
      },
      onError() {
        res.destroy();
      },
    },
  );
}

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  void (api === 'dispatch' ? viaDispatch(req, res) : viaRequest(req, res));
});

server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as AddressInfo;
  process.send?.({ url: `http://127.0.0.1:${port}/v1` });
});
process.on('message', (m: { count?: string }) => {
  if (m.count !== 'usage') return;
  gc();
  const { rss, heapUsed } = process.memoryUsage();
  const cpu = process.cpuUsage();
  process.send?.({ rss, heap: heapUsed, cpuMs: (cpu.user + cpu.system) / 1000 });
});
process.on('disconnect', () => process.exit(0));
