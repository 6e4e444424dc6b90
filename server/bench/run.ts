import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { createSchema, createYoga } from 'graphql-yoga';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/lib/log.js';

// Speed as a ratio against a baseline run side by side, on the same machine, in the same process: a bare
// graphql-yoga server answering the smallest query. Absolute numbers move with the machine; the ratio says
// what Hangar's layers (auth lookup, armor, audit plugin, Pothos, Prisma) cost on top of Yoga itself.

const DURATION_MS = Number(process.argv[2] ?? 3000);
const CONCURRENCY = 16;

type Result = { name: string; requests: number; perSecond: number; p50: number; p99: number };

async function load(name: string, url: string, body: string, headers: Record<string, string> = {}): Promise<Result> {
  const latencies: number[] = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const target = new URL(url);
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
          headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers },
        },
        (res) => {
          let text = '';
          res.on('data', (c) => (text += c));
          res.on('end', () => {
            if (res.statusCode !== 200 || text.includes('"errors"'))
              reject(new Error(`${name}: ${res.statusCode} ${text}`));
            latencies.push(performance.now() - started);
            resolve();
          });
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  for (let i = 0; i < 200; i++) await one(); // warm up: JIT, connection pools, prepared statements
  latencies.length = 0;
  const deadline = performance.now() + DURATION_MS;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < deadline) await one();
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return { name, requests: latencies.length, perSecond: latencies.length / seconds, p50: at(0.5), p99: at(0.99) };
}

const root = path.join(os.tmpdir(), `hangar-bench-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const hangar = await app.start();

// A token made the way a script gets one.
const signIn = await fetch(`${hangar}/graphql`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({
    query:
      'mutation { login(email: "admin@hangar.local", password: "correct-horse-battery") { ... on LoginPayload { csrfToken } } }',
  }),
});
const cookie = signIn.headers
  .getSetCookie()
  .map((c) => c.split(';')[0])
  .join('; ');
const csrf = ((await signIn.json()) as { data: { login: { csrfToken: string } } }).data.login.csrfToken;
const made = await fetch(`${hangar}/graphql`, {
  method: 'POST',
  headers: { 'content-type': 'application/json', cookie, 'x-hangar-csrf': csrf },
  body: JSON.stringify({
    query: 'mutation { createApiToken(input: {name: "bench", role: VIEWER}) { ... on CreatedApiToken { secret } } }',
  }),
});
const token = ((await made.json()) as { data: { createApiToken: { secret: string } } }).data.createApiToken.secret;

const bare = createYoga({
  schema: createSchema({ typeDefs: 'type Query { hello: String }', resolvers: { Query: { hello: () => 'world' } } }),
  logging: false,
});
const bareServer = http.createServer(bare);
await new Promise<void>((r) => bareServer.listen(0, '127.0.0.1', r));
const bareUrl = `http://127.0.0.1:${(bareServer.address() as { port: number }).port}/graphql`;

const baseline = await load('bare yoga { hello }', bareUrl, JSON.stringify({ query: '{ hello }' }));
const anon = await load(
  'hangar { __typename } (anonymous)',
  `${hangar}/graphql`,
  JSON.stringify({ query: '{ __typename }' }),
);
const authed = await load(
  'hangar { viewer { role user { email } } } (API token)',
  `${hangar}/graphql`,
  JSON.stringify({ query: '{ viewer { role user { email } } }' }),
  {
    authorization: `Bearer ${token}`,
  },
);

console.log(
  `GraphQL over HTTP, ${CONCURRENCY} concurrent keep-alive clients, ${DURATION_MS} ms each, loopback, ${os.cpus().length} cores`,
);
for (const r of [baseline, anon, authed]) {
  const ratio = r === baseline ? 'baseline' : `${(r.perSecond / baseline.perSecond).toFixed(2)}× baseline`;
  console.log(
    `  ${r.name.padEnd(56)} ${r.perSecond.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms  ${ratio}`,
  );
}

bareServer.close();
await app.stop();
await fs.rm(root, { recursive: true, force: true });
