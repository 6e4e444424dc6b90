import { type ChildProcess, spawn } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

// What authentication costs a trivial query: `{ viewer { role user { email } } }` with an API token, 10
// keep-alive connections, against bare graphql-yoga on the same SDL answering it from a constant. Each side
// runs in its own process and the rounds are interleaved (bare, hangar, bare, hangar, …), so a machine that
// slows down midway slows both; the median of the rounds is reported with its spread.
//
//   tsx bench/auth.ts [ms per round] [rounds] [another server/src to compare, e.g. an older checkout's]

const ROUND_MS = Number(process.argv[2] ?? 3000);
const ROUNDS = Number(process.argv[3] ?? 3);
const OTHER_SRC = process.argv[4];
const CONNECTIONS = 10;
const QUERY = JSON.stringify({ query: '{ viewer { role user { email } } }' });
const here = path.dirname(fileURLToPath(import.meta.url));

type Side = { name: string; url: string; token: string; child: ChildProcess };
type Round = { perSecond: number; p50: number; p99: number };

// A side left running when this script fails would keep its embedded database up.
const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

async function startSide(name: string, args: string[]): Promise<Side> {
  // BENCH_CPU_PROF=<dir> writes each side's CPU profile there when it stops, to see where a request's time goes.
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  const child = spawn(process.execPath, [...profile, '--import', 'tsx', path.join(here, 'auth-server.ts'), ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  const lines = readline.createInterface({ input: child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) {
    if (!line.startsWith('{')) continue;
    const { url, token } = JSON.parse(line) as { url: string; token: string };
    return { name, url, token, child };
  }
  throw new Error(`${name}: the server ended before it answered`);
}

async function round(side: Side): Promise<Round> {
  const target = new URL(side.url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  const latencies: number[] = [];
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
            'content-length': Buffer.byteLength(QUERY),
            authorization: `Bearer ${side.token}`,
          },
        },
        (res) => {
          let text = '';
          res.on('data', (c) => (text += c));
          res.on('end', () => {
            if (res.statusCode !== 200 || !text.includes('"email"')) {
              reject(new Error(`${side.name}: ${res.statusCode} ${text}`));
              return;
            }
            latencies.push(performance.now() - started);
            resolve();
          });
        },
      );
      req.on('error', reject);
      req.end(QUERY);
    });
  for (let i = 0; i < 300; i++) await one(); // warm up: JIT, pools, prepared statements
  latencies.length = 0;
  const started = performance.now();
  const deadline = started + ROUND_MS;
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (performance.now() < deadline) await one();
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return { perSecond: latencies.length / seconds, p50: at(0.5), p99: at(0.99) };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

const sides = [
  await startSide('bare yoga (no auth work)', ['bare']),
  await startSide('hangar (this tree)', ['hangar', path.join(here, '../src')]),
  ...(OTHER_SRC ? [await startSide(`hangar (${OTHER_SRC})`, ['hangar', path.resolve(OTHER_SRC)])] : []),
];
const results = new Map<Side, Round[]>(sides.map((s) => [s, []]));
try {
  for (let r = 0; r < ROUNDS; r++) for (const side of sides) results.get(side)?.push(await round(side));
} finally {
  for (const child of children) child.kill('SIGTERM');
  children.length = 0;
}

console.log(
  `{ viewer { role user { email } } } with an API token, ${CONNECTIONS} keep-alive connections, ${ROUNDS} interleaved rounds of ${ROUND_MS} ms, ${os.cpus().length} cores`,
);
const baseline = median(results.get(sides[0] as Side)?.map((x) => x.perSecond) ?? []);
const baselineP50 = median(results.get(sides[0] as Side)?.map((x) => x.p50) ?? []);
for (const side of sides) {
  const rs = results.get(side) ?? [];
  const rates = rs.map((x) => x.perSecond);
  const p50 = median(rs.map((x) => x.p50));
  const ratio =
    side === sides[0]
      ? 'baseline'
      : `${(median(rates) / baseline).toFixed(2)}× req/s, p50 ${(p50 / baselineP50).toFixed(2)}×`;
  console.log(
    `  ${side.name.padEnd(40)} ${median(rates).toFixed(0).padStart(6)} req/s (${Math.min(...rates).toFixed(0)}–${Math.max(...rates).toFixed(0)})  p50 ${p50.toFixed(2)} ms  p99 ${median(rs.map((x) => x.p99)).toFixed(2)} ms  ${ratio}`,
  );
}
