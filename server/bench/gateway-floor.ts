import http from 'node:http';
import type { AddressInfo } from 'node:net';
import v8 from 'node:v8';
import vm from 'node:vm';

// The floor of bench/gateway.ts: the least a Node process between a client and an engine costs. A bare reverse
// proxy, in a process of its own as the gateway is: http.createServer, one http.request per request over a
// keep-alive agent, the engine key swapped in, the answer piped back. No callers, names, routing, taps or usage.
// What the gateway adds beyond this is Hangar's own; what this adds beyond direct is one more hop through Node.
//
// The engine's endpoint and key come in HANGAR_BENCH_ENGINE / HANGAR_BENCH_ENGINE_KEY; the bound URL goes back over
// IPC; {count: 'usage'} is answered with this process's memory (after a full GC) and CPU time so far.

const engine = process.env.HANGAR_BENCH_ENGINE ?? '';
const key = process.env.HANGAR_BENCH_ENGINE_KEY ?? '';
const agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 256 });

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const upstream = http.request(
    `${engine}${(req.url ?? '/').replace(/^\/v1/, '')}`,
    {
      method: req.method,
      agent,
      headers: {
        'content-type': req.headers['content-type'] ?? 'application/json',
        'content-length': req.headers['content-length'] ?? '0',
        authorization: `Bearer ${key}`,
      },
    },
    (answer) => {
      const headers: Record<string, string> = { 'content-type': answer.headers['content-type'] ?? 'text/plain' };
      if (answer.headers['content-length']) headers['content-length'] = answer.headers['content-length'];
      res.writeHead(answer.statusCode ?? 502, headers);
      answer.pipe(res);
    },
  );
  upstream.on('error', () => res.destroy());
  // A client that goes away takes the engine's side with it, as the gateway does.
  res.on('close', () => {
    if (!res.writableFinished) upstream.destroy();
  });
  req.pipe(upstream);
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
