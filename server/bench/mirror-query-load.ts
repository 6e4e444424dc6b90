import http from 'node:http';
import zlib from 'node:zlib';

// The load generator of bench/mirror-query.ts, in a process of its own (forked, asked over IPC): the console is
// another process on another machine, and reading the answers in a server's process would bill that server for
// its client. Each job: `clients` keep-alive connections posting the same body for `ms`; the answer is
// decompressed and checked as the console would, and the rate, p50 and answer size are sent back.

export type LoadJob = { url: string; body: string; headers: Record<string, string>; clients: number; ms: number };
export type LoadResult = { perSecond: number; p50: number; bytes: number };

async function run(job: LoadJob): Promise<LoadResult> {
  const latencies: number[] = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: job.clients });
  const target = new URL(job.url);
  let bytes = 0;
  const one = () =>
    new Promise<void>((resolve, reject) => {
      const started = performance.now();
      const req = http.request(
        {
          host: target.hostname,
          port: target.port,
          path: target.pathname,
          method: 'POST',
          agent,
          headers: {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(job.body),
            ...job.headers,
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const raw = Buffer.concat(chunks);
            bytes = raw.length;
            const enc = res.headers['content-encoding'];
            const text = (
              enc === 'br' ? zlib.brotliDecompressSync(raw) : enc === 'gzip' ? zlib.gunzipSync(raw) : raw
            ).toString();
            if (res.statusCode !== 200 || text.includes('"errors"')) {
              reject(new Error(`${job.url} answered ${res.statusCode}: ${text.slice(0, 500)}`));
              return;
            }
            latencies.push(performance.now() - started);
            resolve();
          });
        },
      );
      req.on('error', reject);
      req.end(job.body);
    });
  // Warm-up: connections opened, the document compiled and cached on the server.
  for (let i = 0; i < 20; i++) await one();
  latencies.length = 0;
  const deadline = performance.now() + job.ms;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: job.clients }, async () => {
      while (performance.now() < deadline) await one();
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  return { perSecond: latencies.length / seconds, p50: latencies[Math.floor(latencies.length / 2)] ?? 0, bytes };
}

process.on('message', (job: LoadJob) => {
  run(job).then(
    (result) => process.send?.({ result }),
    (err: Error) => process.send?.({ error: err.message }),
  );
});
