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

const hangar = {
  month: () => usage.usage(viewer, { from: new Date(FROM), to: new Date(FROM + 31 * DAY), step: 1440 }),
  day: () =>
    usage.usage(viewer, { model: 'model-0', from: new Date(FROM + 30 * DAY), to: new Date(FROM + 31 * DAY), step: 1 }),
  tokens: () => usage.totalsByToken(viewer, tokens, new Date(FROM + 30 * DAY), new Date(FROM + 31 * DAY)),
};

/** usage()'s statement before #33, for the month by day: the histogram summed by a subquery per step. */
const before = () =>
  db.$queryRawUnsafe(`
    WITH r AS (
      SELECT floor((extract(epoch FROM "minute") * 1000 - ${FROM}) / ${DAY})::int AS bin, * FROM "UsageMinute"
      WHERE "minute" >= (to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC')
        AND "minute" < (to_timestamp(${(FROM + 31 * DAY) / 1000}) AT TIME ZONE 'UTC')
    ), h AS (
      SELECT r.bin, b.i, sum(b.n)::float8 AS n
      FROM r CROSS JOIN LATERAL unnest(r."durationBuckets") WITH ORDINALITY AS b(n, i) GROUP BY r.bin, b.i
    )
    SELECT r.bin, sum(r.requests)::float8, (SELECT array_agg(h.n ORDER BY h.i) FROM h WHERE h.bin = r.bin) AS buckets
    FROM r GROUP BY r.bin ORDER BY r.bin`);

const load = () => os.loadavg()[0]?.toFixed(2);
console.log(`usage bench: ${ROUNDS} rounds, medians (min–max) in ms; load ${load()} on ${os.cpus().length} cores`);
console.log('rows      query   baseline(own process)  Hangar                   ratio   before #33');
try {
  for (const n of SIZES) {
    await seed(n);
    const base = JSON.parse(
      execFileSync(
        process.execPath,
        [
          ...process.execArgv,
          path.join(import.meta.dirname, 'usage-baseline.ts'),
          app.db.url,
          String(FROM),
          String(ROUNDS),
        ],
        { encoding: 'utf8' },
      ).trim(),
    ) as Record<string, number>;
    for (const [name, run] of Object.entries(hangar)) {
      const h = await time(run);
      const b = base[name] ?? Number.NaN;
      const old = name === 'month' && n <= 1_000_000 ? await time(before, n >= 1_000_000 ? 1 : 3) : null;
      console.log(
        `${`${String(n).padEnd(9)} ${name.padEnd(7)} ${b.toFixed(1).padStart(10)}            ${h.median.toFixed(1).padStart(8)} (${h.min.toFixed(1)}–${h.max.toFixed(1)})`.padEnd(
          74,
        )}${(h.median / b).toFixed(2)}×   ${old ? `${old.median.toFixed(0)} ms` : ''}`,
      );
    }
  }
  console.log(`load after: ${load()}`);
} finally {
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}
