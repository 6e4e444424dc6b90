import { type ChildProcess, spawn } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

// Speed as a ratio against a baseline run side by side, on the same machine: a bare graphql-yoga server on
// Hangar's SDL with graphql-jit (bench/auth-server.ts), answering from constants. Absolute numbers move with the
// machine; the ratio says what Hangar's layers (auth lookup, armor, audit plugin, Pothos, Prisma) cost on top of
// Yoga and its executor.
// Each side runs in its own process, and the rounds are interleaved (bare, hangar, bare, hangar, …): run first
// and once, in the same process, the baseline swung the ratio 0.9×–1.3× from one run to the next. The median
// round is reported with the spread of the rounds.
//
//   tsx bench/run.ts [ms per round] [rounds]

const ROUND_MS = Number(process.argv[2] ?? 3000);
const ROUNDS = Math.max(3, Number(process.argv[3] ?? 3));
const CONCURRENCY = 16;
const here = path.dirname(fileURLToPath(import.meta.url));

type Side = { name: string; url: string; token: string; child: ChildProcess };
type Case = { name: string; body: string; authenticated: boolean };
type Round = { perSecond: number; p50: number; p99: number };

const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

async function startSide(name: string, args: string[]): Promise<Side> {
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(here, 'auth-server.ts'), ...args], {
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

async function load(side: Side, c: Case): Promise<Round> {
  const latencies: number[] = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const target = new URL(side.url);
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(c.body),
  };
  if (c.authenticated) headers.authorization = `Bearer ${side.token}`;
  const one = () =>
    new Promise<void>((resolve, reject) => {
      const started = performance.now();
      const req = http.request(
        { host: target.hostname, port: target.port, path: target.pathname, method: 'POST', agent, headers },
        (res) => {
          let text = '';
          res.on('data', (chunk) => (text += chunk));
          res.on('end', () => {
            if (res.statusCode !== 200 || text.includes('"errors"')) {
              reject(new Error(`${side.name}, ${c.name}: ${res.statusCode} ${text}`));
              return;
            }
            latencies.push(performance.now() - started);
            resolve();
          });
        },
      );
      req.on('error', reject);
      req.end(c.body);
    });
  for (let i = 0; i < 200; i++) await one(); // warm up: JIT, connection pools, prepared statements
  latencies.length = 0;
  const started = performance.now();
  const deadline = started + ROUND_MS;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
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

const cases: Case[] = [
  { name: '{ __typename } (anonymous)', body: JSON.stringify({ query: '{ __typename }' }), authenticated: false },
  {
    name: '{ viewer { role user { email } } } (API token)',
    body: JSON.stringify({ query: '{ viewer { role user { email } } }' }),
    authenticated: true,
  },
];
const sides = [
  await startSide('bare yoga + jit', ['bare']),
  await startSide('hangar', ['hangar', path.join(here, '../src')]),
];
const results = new Map<string, Round[]>();
try {
  for (let r = 0; r < ROUNDS; r++) {
    for (const c of cases) {
      for (const side of sides) {
        const key = `${c.name} ${side.name}`;
        results.set(key, [...(results.get(key) ?? []), await load(side, c)]);
      }
    }
  }
} finally {
  for (const child of children) child.kill('SIGTERM');
  children.length = 0;
}

console.log(
  `GraphQL over HTTP, ${CONCURRENCY} concurrent keep-alive clients, ${ROUNDS} interleaved rounds of ${ROUND_MS} ms, each side in its own process, loopback, ${os.cpus().length} cores`,
);
for (const c of cases) {
  console.log(`  ${c.name}`);
  const base = results.get(`${c.name} ${sides[0]?.name}`) ?? [];
  const baseRate = median(base.map((x) => x.perSecond));
  const baseP50 = median(base.map((x) => x.p50));
  for (const side of sides) {
    const rs = results.get(`${c.name} ${side.name}`) ?? [];
    const rates = rs.map((x) => x.perSecond);
    const p50 = median(rs.map((x) => x.p50));
    const ratio =
      side === sides[0]
        ? 'baseline'
        : `${(median(rates) / baseRate).toFixed(2)}× req/s (${(Math.min(...rates) / baseRate).toFixed(2)}–${(Math.max(...rates) / baseRate).toFixed(2)}), p50 ${(p50 / baseP50).toFixed(2)}×`;
    console.log(
      `    ${side.name.padEnd(15)} ${median(rates).toFixed(0).padStart(6)} req/s (${Math.min(...rates).toFixed(0)}–${Math.max(...rates).toFixed(0)})  p50 ${p50.toFixed(2)} ms  p99 ${median(rs.map((x) => x.p99)).toFixed(2)} ms  ${ratio}`,
    );
  }
}
