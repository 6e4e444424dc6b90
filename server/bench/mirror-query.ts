import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { recordSql } from '../test/sql-count.js';
import { benchToken } from './api-token.js';

// The Mirror page's query (the console's own selection) at 200 versions, against the same query without
// `usedBy` as its baseline, interleaved in rounds in this one process: the ratio says what finding each version's
// users costs. Also counted: the SQL round-trips one query takes (at 3 and at the full count, to show whether
// they grow with the versions) and the bytes of its answer, plain and compressed.
//   tsx bench/mirror-query.ts [versions=200] [ms per round=2000] [rounds=3]

const VERSIONS = Number(process.argv[2] ?? 200);
const DURATION_MS = Number(process.argv[3] ?? 2000);
const ROUNDS = Number(process.argv[4] ?? 3);
const CONCURRENCY = Number(process.env.CLIENTS ?? 10);

const USED_BY = 'usedBy { name mode replicas declared }';
const pageQuery = (usedBy: boolean) => `query MirrorPage_Mirror { mirror { baseUrl fetching present failed diskFreeBytes
  families { name modelCount versions { id model version state removed fileCount
    files { id file state bytesDone bytesTotal bytesPerSecond sha256 expectedSha256 verified error url sourceUrl }
    bytesDone bytesTotal percent bytesPerSecond etaSeconds error verified url ${usedBy ? USED_BY : ''} updatedAt } } } }`;

const root = path.join(os.tmpdir(), `hangar-bench-mirror-query-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const hangar = await app.start();
const db = app.db.prisma;

const token = await benchToken(hangar);

/** N present versions of one file each, a catalog model on every tenth and an adapter on every twentieth. */
async function seed(n: number) {
  await db.adapter.deleteMany();
  await db.catalogModel.deleteMany();
  await db.mirrorFile.deleteMany();
  const files = Array.from({ length: n }, (_, i) => ({
    model: `fam${i % 17}-model-${i}`,
    version: `v${i}`,
    file: 'model.gguf',
    sourceUrl: `https://hub.example/fam${i}/model.gguf`,
    state: 'PRESENT' as const,
    bytesDone: 1_000_000n + BigInt(i),
    bytesTotal: 1_000_000n + BigInt(i),
    expectedSha256: 'a'.repeat(64),
    actualSha256: 'a'.repeat(64),
  }));
  await db.mirrorFile.createMany({ data: files });
  for (let i = 0; i < n; i += 10) {
    const m = await db.catalogModel.create({
      data: {
        name: `model-${i}`,
        source: `${hangar}/mirror/${files[i]?.model}/${files[i]?.version}/model.gguf`,
        engine: 'llamacpp',
      },
    });
    if (i % 20 === 0 && i + 1 < n) {
      await db.adapter.create({
        data: {
          name: `adapter-${i}`,
          source: `${hangar}/mirror/${files[i + 1]?.model}/${files[i + 1]?.version}/lora.gguf`,
          modelId: m.id,
        },
      });
    }
  }
}

/** The SQL statements one in-process request of the query costs (test/sql-count.ts). */
async function roundTrips(q: string) {
  const { statements } = await recordSql(async () => {
    const res = await app.yoga.fetch('http://hangar/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ query: q }),
    });
    await res.text();
  });
  return statements.length;
}

type Result = { perSecond: number; p50: number; bytes: number };
async function load(body: string, headers: Record<string, string> = {}): Promise<Result> {
  const latencies: number[] = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const target = new URL(`${hangar}/graphql`);
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
            'content-length': Buffer.byteLength(body),
            authorization: `Bearer ${token}`,
            ...headers,
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
            if (res.statusCode !== 200 || text.includes('"errors"')) reject(new Error(`${res.statusCode} ${text}`));
            latencies.push(performance.now() - started);
            resolve();
          });
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  for (let i = 0; i < 20; i++) await one();
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
  return { perSecond: latencies.length / seconds, p50: latencies[Math.floor(latencies.length / 2)] ?? 0, bytes };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[]) => `${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)}`;

await seed(3);
await roundTrips('{ viewer { role } }'); // the token's first lookup, outside the count
const tripsAt3 = await roundTrips(pageQuery(true));
await seed(VERSIONS);
const tripsAtN = await roundTrips(pageQuery(true));
const tripsWithout = await roundTrips(pageQuery(false));

const withUsers = JSON.stringify({ query: pageQuery(true) });
const without = JSON.stringify({ query: pageQuery(false) });
const rounds: { base: Result; page: Result }[] = [];
for (let r = 0; r < ROUNDS; r++) {
  // Alternating which goes first, so neither always meets a warmer process.
  const first = r % 2 === 0 ? 'base' : 'page';
  const a = await load(first === 'base' ? without : withUsers);
  const b = await load(first === 'base' ? withUsers : without);
  rounds.push(first === 'base' ? { base: a, page: b } : { base: b, page: a });
}
const plain = await load(withUsers, { 'accept-encoding': 'identity' });
const br = await load(withUsers, { 'accept-encoding': 'br' });
const gzip = await load(withUsers, { 'accept-encoding': 'gzip' });

const rate = (k: 'base' | 'page') => rounds.map((r) => r[k].perSecond);
const p50 = (k: 'base' | 'page') => rounds.map((r) => r[k].p50);
console.log(
  `The Mirror page's query, ${VERSIONS} versions, ${CONCURRENCY} concurrent clients, ${ROUNDS} interleaved rounds of ${DURATION_MS} ms, ${os.cpus().length} cores`,
);
console.log(
  `  SQL round-trips per query: ${tripsAt3} at 3 versions, ${tripsAtN} at ${VERSIONS} (${tripsWithout} without usedBy)`,
);
console.log(
  `  without usedBy (baseline)  ${median(rate('base')).toFixed(0).padStart(6)} req/s (${spread(rate('base'))})  p50 ${median(p50('base')).toFixed(1)} ms`,
);
console.log(
  `  the page's query           ${median(rate('page')).toFixed(0).padStart(6)} req/s (${spread(rate('page'))})  p50 ${median(p50('page')).toFixed(1)} ms  ${(median(rate('page')) / median(rate('base'))).toFixed(2)}× baseline`,
);
for (const [name, r] of [
  ['plain', plain],
  ['br', br],
  ['gzip', gzip],
] as const) {
  console.log(
    `  answer ${name.padEnd(6)} ${String(r.bytes).padStart(9)} bytes  ${r.perSecond.toFixed(0).padStart(6)} req/s  p50 ${r.p50.toFixed(1)} ms`,
  );
}

await app.stop();
await fs.rm(root, { recursive: true, force: true });
