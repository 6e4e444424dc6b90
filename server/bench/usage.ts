import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import type { Viewer } from '../src/auth/viewer.js';
import { loadConfig } from '../src/config.js';
import { USAGE_BUCKETS_MS } from '../src/gateway/usage.js';

// Time against rows for what the console asks of usage (#33), through Hangar's UsageService on its embedded
// PostgreSQL (which reads the rollups: quarter hours, hours, days and day prefixes, gateway/usage-rollup.ts), at
// 10^4, 10^5 and 10^6 minute rows:
//   month   usage() over 31 days by day, from 10:17 (ragged: every day's step has minutes at its edges)
//   month0  the same from midnight (every step a whole day)
//   day     one model over one day at one-minute steps
//   tokens  the Tokens page: 20 tokens' totals over the last 24 hours, from 10:17
//   week    usage() over 7 days by hour, from 10:17 (no whole hour inside any step)
// The baseline is the same answer (sums and histogram) from one GROUP BY pass over the minute rows, as usage() read
// them before the rollups, with node-postgres in its own process (bench/usage-baseline.ts), on the same rows. Rounds
// alternate: a baseline round (every query once, in its process), then a Hangar round, so both see the same load.
// The rows: `keys` distinct callers × models × replicas (default 80: 20 tokens, 40 models, 2 replicas each), each
// minute holding the next n/44,640 of them in turn, so a key recurs through the hour. More keys compress less: at
// 2,000 keys and 10^6 rows an hour's rows are nearly all distinct (run with keys=2000 to see that case).
//   tsx bench/usage.ts [sizes=10000,100000,1000000] [rounds=5] [keys=80]

const SIZES = (process.argv[2] ?? '10000,100000,1000000').split(',').map(Number);
const ROUNDS = Number(process.argv[3] ?? 5);
const KEYS = Number(process.argv[4] ?? 80);
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const FROM = Date.UTC(2026, 9, 1);
const RAGGED = 10 * HOUR + 17 * MINUTE;

const root = path.join(os.tmpdir(), `hangar-bench-usage-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });
const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
  // Nothing pruned: the generated month is in the past.
  HANGAR_USAGE_RETENTION: 'minutes=forever,hours=forever,days=forever',
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
 * n minute rows spread evenly over the 31 days, written as the recorder writes them (one INSERT: the rollup
 * trigger adds them to the hours and days as it does for the recorder's batches). Key k: token k % 20, model
 * k % 40, replica k (so KEYS replicas of KEYS / 40 per model); row i has key i % KEYS.
 */
async function seed(n: number) {
  await db.$executeRawUnsafe('TRUNCATE "UsageMinute", "UsageQuarter", "UsageHour", "UsageDay", "UsageDayPrefix"');
  await db.$executeRawUnsafe(`
    INSERT INTO "UsageMinute" (minute, "tokenId", "userId", model, adapter, node, "replicaId", requests, errors,
      aborted, "promptTokens", "completionTokens", "ttftMsSum", "ttftCount", "durationMsSum", "durationBuckets")
    SELECT (to_timestamp(${FROM / 1000}) AT TIME ZONE 'UTC') + make_interval(mins => (i * ${31 * 1440}::bigint / ${n})::int),
      'tok-' || (i % ${KEYS} % 20), '${admin.id}', 'model-' || (i % ${KEYS} % 40), '', 'n1', 'r' || (i % ${KEYS}),
      10, i % 2, 0, 500, 900, 4000, 10, 7000, ARRAY[i % 3, 1, i % 5, 2, 0, i % 7, 1, 0, 0, 0, 0, i % 2]
    FROM generate_series(0, ${n - 1}) AS i`);
  await db.$executeRawUnsafe('ANALYZE "UsageMinute", "UsageQuarter", "UsageHour", "UsageDay", "UsageDayPrefix"');
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
const ranges = {
  month: { from: FROM + RAGGED, to: FROM + 31 * DAY, step: 1440 },
  month0: { from: FROM, to: FROM + 31 * DAY, step: 1440 },
  day: { from: FROM + 30 * DAY, to: FROM + 31 * DAY, step: 1, model: 'model-0' },
  tokens: { from: FROM + 29 * DAY + RAGGED, to: FROM + 30 * DAY + RAGGED },
  week: { from: FROM + RAGGED, to: FROM + 7 * DAY + RAGGED, step: 60 },
};

const hangar = {
  month: () =>
    usage.usage(viewer, { ...ranges.month, from: new Date(ranges.month.from), to: new Date(ranges.month.to) }),
  month0: () =>
    usage.usage(viewer, { ...ranges.month0, from: new Date(ranges.month0.from), to: new Date(ranges.month0.to) }),
  day: () => usage.usage(viewer, { ...ranges.day, from: new Date(ranges.day.from), to: new Date(ranges.day.to) }),
  tokens: () => usage.totalsByToken(viewer, tokens, new Date(ranges.tokens.from), new Date(ranges.tokens.to)),
  week: () => usage.usage(viewer, { ...ranges.week, from: new Date(ranges.week.from), to: new Date(ranges.week.to) }),
};

// The baseline's statements: one pass over the minutes, the same sums and histogram per step.
const window = (from: number, to: number) =>
  `"minute" >= (to_timestamp(${from / 1000}) AT TIME ZONE 'UTC') AND "minute" < (to_timestamp(${to / 1000}) AT TIME ZONE 'UTC')`;
const sums = `sum(requests)::float8, sum(errors)::float8, sum(aborted)::float8, sum("promptTokens")::float8,
  sum("completionTokens")::float8, sum("cachedTokens")::float8, sum("ttftMsSum")::float8, sum("ttftCount")::float8,
  ARRAY[${USAGE_BUCKETS_MS.map((_, i) => `sum(coalesce("durationBuckets"[${i + 1}], 0))`).join(', ')}]::float8[]`;
const bin = (from: number, stepMs: number) => `floor((extract(epoch FROM minute) * 1000 - ${from}) / ${stepMs})::int`;
const baseline: Record<keyof typeof hangar, string> = {
  month: `SELECT ${bin(ranges.month.from, DAY)}, ${sums} FROM "UsageMinute" WHERE ${window(ranges.month.from, ranges.month.to)} GROUP BY 1`,
  month0: `SELECT ${bin(ranges.month0.from, DAY)}, ${sums} FROM "UsageMinute" WHERE ${window(ranges.month0.from, ranges.month0.to)} GROUP BY 1`,
  day: `SELECT minute, ${sums} FROM "UsageMinute" WHERE model = 'model-0' AND ${window(ranges.day.from, ranges.day.to)} GROUP BY 1`,
  tokens: `SELECT "tokenId", ${sums} FROM "UsageMinute" WHERE "tokenId" IN (${tokens.map((t) => `'${t}'`).join(',')}) AND ${window(ranges.tokens.from, ranges.tokens.to)} GROUP BY 1`,
  week: `SELECT ${bin(ranges.week.from, HOUR)}, ${sums} FROM "UsageMinute" WHERE ${window(ranges.week.from, ranges.week.to)} GROUP BY 1`,
};

const load = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
console.log(
  `usage bench: ${ROUNDS} rounds, medians (min–max) in ms; ${KEYS} keys; load ${load()} on ${os.cpus().length} cores`,
);
console.log('rows      query   one pass over minutes (own process)   Hangar (rollups)          Hangar/baseline');
try {
  for (const n of SIZES) {
    await seed(n);
    const counts = await db.$queryRawUnsafe<{ q: number; h: number; d: number; p: number }[]>(
      `SELECT (SELECT count(*) FROM "UsageQuarter")::int AS q, (SELECT count(*) FROM "UsageHour")::int AS h,
        (SELECT count(*) FROM "UsageDay")::int AS d, (SELECT count(*) FROM "UsageDayPrefix")::int AS p`,
    );
    const c = counts[0];
    console.log(`${n} minute rows: ${c?.q} quarter, ${c?.h} hour, ${c?.d} day, ${c?.p} day-prefix rows`);
    // One warm-up of each side, then rounds alternating between the baseline's process and Hangar.
    const baseRound = (rounds: number) =>
      JSON.parse(
        execFileSync(
          process.execPath,
          [
            ...process.execArgv,
            path.join(import.meta.dirname, 'usage-baseline.ts'),
            app.db.url,
            JSON.stringify(baseline),
            String(rounds),
          ],
          { encoding: 'utf8' },
        ).trim(),
      ) as Record<string, { median: number }>;
    baseRound(0);
    for (const run of Object.values(hangar)) await run();
    const times = Object.fromEntries(
      Object.keys(hangar).map((name) => [name, { base: [] as number[], hangar: [] as number[] }]),
    );
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, b] of Object.entries(baseRound(1))) {
        times[name]?.base.push(b.median);
      }
      for (const [name, run] of Object.entries(hangar)) {
        const t0 = performance.now();
        await run();
        times[name]?.hangar.push(performance.now() - t0);
      }
    }
    for (const name of Object.keys(hangar)) {
      const stats = (xs: number[]) => ({ median: median(xs), min: Math.min(...xs), max: Math.max(...xs) });
      const b = times[name]?.base.length ? stats(times[name].base) : undefined;
      const h = stats(times[name]?.hangar ?? []);
      const span = (x: { median: number; min: number; max: number }) =>
        `${x.median.toFixed(1).padStart(8)} (${x.min.toFixed(1)}–${x.max.toFixed(1)})`;
      console.log(
        `${String(n).padEnd(9)} ${name.padEnd(7)} ${(b ? span(b) : 'n/a').padEnd(37)} ${span(h).padEnd(25)} ${b ? (h.median / b.median).toFixed(2) : '?'}×`,
      );
    }
  }
  console.log(`load after: ${load()}`);
} finally {
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}
