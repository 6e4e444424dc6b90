import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import type { Viewer } from '../src/auth/viewer.js';
import { loadConfig } from '../src/config.js';

// Time against rows for what the console asks of usage (#33): usage() over 31 days by day, one model over one day at
// one-minute steps, and the Tokens page (20 tokens, last 24 h), through Hangar's UsageService on its embedded
// PostgreSQL, at 10^4, 10^5 and 10^6 generated rows. The baseline is one plain GROUP BY pass over the same rows
// with node-postgres, in its own process (bench/usage-baseline.ts). "before" is the statement usage() sent before
// #33 (a histogram subquery per step), run here on the same rows where it finishes in reasonable time.
//   tsx bench/usage.ts [sizes=10000,100000,1000000] [rounds=5]

const SIZES = (process.argv[2] ?? '10000,100000,1000000').split(',').map(Number);
const ROUNDS = Number(process.argv[3] ?? 5);
const DAY = 86_400_000;
const FROM = Date.UTC(2026, 9, 1);

const root = path.join(os.tmpdir(), `hangar-bench-usage-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
await app.start();
const db = app.db.prisma;
const admin = await db.user.findFirstOrThrow({ where: { role: 'ADMIN' } });
const viewer: Viewer = {
  kind: 'user',
  user: { id: admin.id, email: admin.email, name: admin.name, role: admin.role },
  role: 'ADMIN',
  sessionId: 'bench-usage',
};
const usage = app.services.usage;
const tokens = Array.from({ length: 20 }, (_, i) => `tok-${i}`);

/**
 * n rows spread evenly over the 31 days, 40 models and 20 tokens, each with a 12-bucket histogram: the shape the
 * recorder leaves (one row per minute, caller, model, adapter and replica). Unique keys: replicaId carries i.
 */
async function seed(n: number) {
  await db.$executeRawUnsafe('TRUNCATE "UsageMinute"');
  await db.$executeRawUnsafe(`
    INSERT INTO "UsageMinute" (minute, "tokenId", "userId", model, adapter, node, "replicaId", requests, errors,
      aborted, "promptTokens", "completionTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
    SELECT (to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC') + make_interval(mins => (i * ${31 * 1440}::bigint / ${n})::int),
      'tok-' || (i % 20), '${admin.id}', 'model-' || (i % 40), '', 'n1', 'r' || i, 10, i % 2, 0, 500, 900, 4000, 10, 7000,
      ARRAY[i % 3, 1, i % 5, 2, 0, i % 7, 1, 0, 0, 0, 0, i % 2]
    FROM generate_series(0, ${n - 1}) AS i`);
  await db.$executeRawUnsafe('ANALYZE "UsageMinute"');
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
async function time(run: () => Promise<unknown>, rounds = ROUNDS) {
  await run();
  const times: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const t0 = performance.now();
    await run();
    times.push(performance.now() - t0);
  }
  return { median: median(times), min: Math.min(...times), max: Math.max(...times) };
}

await seed(300000);
const w = `"minute" >= (to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC') AND "minute" < (to_timestamp(${(FROM + 31 * DAY) / 1000}) AT TIME ZONE 'UTC')`;
const sums = `sum(requests)::float8, sum(errors)::float8`;
const cells = Array.from({ length: 12 }, (_, i) => `sum(coalesce("durationBuckets"[${i + 1}],0))`).join(',');
const tail = `sum(CASE WHEN cardinality("durationBuckets") > 12 THEN (SELECT sum(x) FROM unnest("durationBuckets"[12:]) AS x) ELSE coalesce("durationBuckets"[12], 0) END)`;
for (const [name, sql] of Object.entries({
  noTail: `SELECT date_bin(make_interval(mins => 1440), minute, to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC') AS at, ${sums}, ARRAY[${cells}]::float8[] FROM "UsageMinute" WHERE ${w} GROUP BY 1`,
  tail: `SELECT date_bin(make_interval(mins => 1440), minute, to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC') AS at, ${sums}, ARRAY[${cells}, ${tail}]::float8[] FROM "UsageMinute" WHERE ${w} GROUP BY 1`,
})) {
  const plan = (await db.$queryRawUnsafe<{ 'QUERY PLAN': string }[]>(`EXPLAIN ${sql}`)).map((r) => r['QUERY PLAN']).join('\n');
  console.log(name, plan.includes('Gather') ? 'PARALLEL' : 'serial');
  console.log(name, (await time(() => db.$queryRawUnsafe(sql), 3)).median.toFixed(0));
}
const t = await time(() => usage.usage(viewer, { from: new Date(FROM), to: new Date(FROM + 31 * DAY), step: 1440 }), 3);
console.log('service', t.median.toFixed(0), os.loadavg()[0]);
await app.stop();
await fs.rm(root, { recursive: true, force: true });
