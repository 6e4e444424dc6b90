import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '@hangar/common/free-port';
import { benchToken } from './api-token.js';

// Issue #26, item 6, measured: what 12,000 anonymous GraphQL requests, each with an operation name, a query
// string and an alias of its own, do to /metrics: the series a scrape holds, its size, and the server's memory.
// Hangar runs in a process of its own with its embedded PostgreSQL, from this server/ directory or another one
// (an older checkout, to compare), started from its sources with tsx.
//
//   tsx bench/metrics-cardinality.ts [requests] [another server/ directory]

const REQUESTS = Number(process.argv[2] ?? 12_000);
const SERVER_DIR = path.resolve(process.argv[3] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '..'));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function startHangar(): Promise<{ base: string; child: ChildProcess; dataDir: string }> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cardinality-'));
  // As root, the embedded PostgreSQL runs as the postgres user, who must reach its directory under this one.
  await fs.chmod(dataDir, 0o755);
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
    cwd: SERVER_DIR,
    stdio: ['ignore', 'ignore', 'inherit'],
    env: {
      ...process.env,
      PORT: String(port),
      HANGAR_DATA_DIR: dataDir,
      HANGAR_LOG_LEVEL: 'error',
      HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
      HANGAR_HUB_URL: 'off',
    },
  });
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600 && !exited; i++) {
    if (
      await fetch(`${base}/readyz`).then(
        (r) => r.ok,
        () => false,
      )
    )
      return { base, child, dataDir };
    await sleep(200);
  }
  throw new Error(exited ? 'Hangar exited before it was ready' : 'Hangar did not become ready in 120 s');
}

async function scrape(base: string, token: string) {
  const text = await (await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${token}` } })).text();
  const samples = text.split('\n').filter((l) => l && !l.startsWith('#'));
  const rss = Number(samples.find((l) => l.startsWith('hangar_process_resident_memory_bytes '))?.split(' ')[1]);
  return {
    series: samples.length,
    graphql: samples.filter((l) => l.startsWith('graphql_')).length,
    bytes: Buffer.byteLength(text),
    rssMiB: Math.round(rss / 2 ** 20),
    leaks: /Probe_|leak_/.test(text),
  };
}

const { base, child, dataDir } = await startHangar();
try {
  const token = await benchToken(base, { role: 'VIEWER' });
  const before = await scrape(base, token);
  let sent = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (sent < REQUESTS) {
        const n = `${++sent}x${Math.random().toString(36).slice(2, 8)}`;
        const query = `query Probe_${n} { __typename ok_${n}: __typename denied_${n}: viewer { role } }`;
        const res =
          sent % 2
            ? await fetch(`${base}/graphql?utm_source=leak_${n}`, {
                method: 'POST',
                headers: { 'content-type': 'application/json' },
                body: JSON.stringify({ query, operationName: `Probe_${n}` }),
              })
            : await fetch(`${base}/graphql?query=${encodeURIComponent(query)}&operationName=Probe_${n}&x=leak_${n}`);
        await res.arrayBuffer();
      }
    }),
  );
  const after = await scrape(base, token);
  const line = (what: string, s: typeof before) =>
    `  ${what}: ${s.series} series (${s.graphql} graphql_*), scrape ${(s.bytes / 2 ** 20).toFixed(2)} MB, RSS ${s.rssMiB} MiB${s.leaks ? ', shows the requests\u2019 names and query strings' : ''}`;
  console.log(`${SERVER_DIR}, ${REQUESTS} anonymous requests with unique operation names and query strings`);
  console.log(line('before', before));
  console.log(line('after ', after));
} finally {
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));
  await fs.rm(dataDir, { recursive: true, force: true });
}
process.exit(0);
