import { type ChildProcess, fork, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { recordSql } from '../test/sql-count.js';
import { benchToken } from './api-token.js';
import type { LoadJob, LoadResult } from './mirror-query-load.js';

// The Mirror page's query (the console's own selection) at 200 versions, against a bare graphql-yoga with
// graphql-jit sending the same answer (bench/mirror-query-bare.ts: Hangar's SDL, the answer Hangar gave, no auth,
// no database): the ratio says what Hangar's own layers cost (the token's lookup, armor, the reads and the
// views). Hangar serves from this process, the baseline from its own, and the load comes from a third
// (bench/mirror-query-load.ts); rounds interleaved, alternating which side goes first. Also counted: the SQL
// round-trips one query takes (at 3 and at the full count, to show whether they grow with the versions) and the
// bytes of its answer, plain and compressed.
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

const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});
const client = fork(new URL('./mirror-query-load.ts', import.meta.url), [], {
  execArgv: ['--import', 'tsx'],
  stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
});
children.push(client);

/** One round of load from the client process against `url`. */
function load(url: string, body: string, headers: Record<string, string> = {}): Promise<LoadResult> {
  const job: LoadJob = { url, body, headers, clients: CONCURRENCY, ms: DURATION_MS };
  return new Promise((resolve, reject) => {
    client.once('message', (m: { result?: LoadResult; error?: string }) =>
      m.result ? resolve(m.result) : reject(new Error(m.error)),
    );
    client.send(job);
  });
}

/** The bare graphql-yoga (with graphql-jit) answering with `answer`, in its own process; resolves its URL. */
async function startBare(answerFile: string): Promise<string> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', fileURLToPath(new URL('./mirror-query-bare.ts', import.meta.url)), answerFile],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  children.push(child);
  const lines = readline.createInterface({ input: child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) if (line.startsWith('{')) return (JSON.parse(line) as { url: string }).url;
  throw new Error(`the bare graphql-yoga ended before it listened (exit ${child.exitCode})`);
}

/** The text of one answer, asked over HTTP as the console asks (no compression). */
async function answerOf(url: string, query: string, auth?: string): Promise<string> {
  const res = await fetch(url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'accept-encoding': 'identity',
      ...(auth ? { authorization: auth } : {}),
    },
    body: JSON.stringify({ query }),
  });
  return res.text();
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[], digits = 0) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;

await seed(3);
await roundTrips('{ viewer { role } }'); // the token's first lookup, outside the count
const tripsAt3 = await roundTrips(pageQuery(true));
await seed(VERSIONS);
const tripsAtN = await roundTrips(pageQuery(true));
const tripsWithout = await roundTrips(pageQuery(false));

const withUsers = JSON.stringify({ query: pageQuery(true) });
const hangarUrl = `${hangar}/graphql`;
const auth = { authorization: `Bearer ${token}` };
// The baseline is given Hangar's answer, and must send it back byte for byte: the same answer, only cheaper made.
const answer = await answerOf(hangarUrl, pageQuery(true), auth.authorization);
const answerFile = path.join(root, 'answer.json');
await fs.writeFile(answerFile, answer);
const bareUrl = await startBare(answerFile);
const bareAnswer = await answerOf(bareUrl, pageQuery(true));
if (bareAnswer !== answer) {
  throw new Error(
    `the bare graphql-yoga's answer differs from Hangar's:\n${bareAnswer.slice(0, 300)}\n${answer.slice(0, 300)}`,
  );
}
const rounds: { base: LoadResult; page: LoadResult }[] = [];
for (let r = 0; r < ROUNDS; r++) {
  // Alternating which goes first, so neither always meets a warmer moment of the machine.
  const first = r % 2 === 0 ? 'base' : 'page';
  const a = first === 'base' ? await load(bareUrl, withUsers) : await load(hangarUrl, withUsers, auth);
  const b = first === 'base' ? await load(hangarUrl, withUsers, auth) : await load(bareUrl, withUsers);
  rounds.push(first === 'base' ? { base: a, page: b } : { base: b, page: a });
}
const plain = await load(hangarUrl, withUsers, { ...auth, 'accept-encoding': 'identity' });
const br = await load(hangarUrl, withUsers, { ...auth, 'accept-encoding': 'br' });
const gzip = await load(hangarUrl, withUsers, { ...auth, 'accept-encoding': 'gzip' });

const rate = (k: 'base' | 'page') => rounds.map((r) => r[k].perSecond);
const p50 = (k: 'base' | 'page') => rounds.map((r) => r[k].p50);
console.log(
  `The Mirror page's query, ${VERSIONS} versions, ${CONCURRENCY} concurrent clients, ${ROUNDS} interleaved rounds of ${DURATION_MS} ms, ${os.cpus().length} cores`,
);
console.log(
  `  SQL round-trips per query: ${tripsAt3} at 3 versions, ${tripsAtN} at ${VERSIONS} (${tripsWithout} without usedBy)`,
);
console.log(
  `  answer ${answer.length} bytes, the same from both sides; load ${os
    .loadavg()
    .map((l) => l.toFixed(1))
    .join(' ')}`,
);
console.log(
  `  bare graphql-yoga + jit (baseline)  ${median(rate('base')).toFixed(0).padStart(6)} req/s (${spread(rate('base'))})  p50 ${median(p50('base')).toFixed(1)} ms (${spread(p50('base'), 1)})`,
);
console.log(
  `  Hangar                              ${median(rate('page')).toFixed(0).padStart(6)} req/s (${spread(rate('page'))})  p50 ${median(p50('page')).toFixed(1)} ms (${spread(p50('page'), 1)})  ${(median(rate('page')) / median(rate('base'))).toFixed(2)}× baseline's rate`,
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

for (const child of children) child.kill('SIGTERM');
await app.stop();
await fs.rm(root, { recursive: true, force: true });
