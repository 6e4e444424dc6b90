import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { migrationsDir } from '../db/migrate.js';
import { Prisma } from '../generated/prisma/client.js';
import { type Outcome, USAGE_BUCKETS_MS, type UsageEvent, UsageRecorder } from './usage.js';
import { percentileMs, UsageService, type UsageTotals } from './usage.service.js';
import { type Density, planSteps } from './usage-plan.js';
import { planPieces } from './usage-rollup.js';

// usage() and the Tokens page's totals read the hour and day rollups (usage-rollup.ts) where whole hours and days
// make up a step: checked against the direct minute-level computation (one GROUP BY over UsageMinute, the statement
// usage() sent before the rollups) on randomised usage recorded through the real recorder, in several writes that
// add to minutes already there (the trigger's UPDATE path as well as its INSERT path); and a late row, a spool file
// a crashed process left, replayed into minutes days old, lands in the rollups too.

let t: TestApp;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const T0 = Date.UTC(2026, 9, 1); // a midnight, 31 days before T0 + 31 days
const MODELS = ['llama-7b', 'qwen-1b', 'mistral-7b'];
const TOKENS = ['tok-a', 'tok-b', 'tok-c', ''];
const OUTCOMES: Outcome[] = ['ok', 'ok', 'ok', 'error', 'aborted'];

/** A small deterministic generator (mulberry32): the same usage every run, so a failure can be looked at again. */
function random(seed: number) {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
const r = random(33);
const pickOf = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)] as T;

/** Requests over 31 days, crowded into a few hours so that minutes repeat (the recorder adds to them). */
function events(n: number): UsageEvent[] {
  const busy = Array.from({ length: 40 }, () => T0 + Math.floor(r() * 31 * 24) * HOUR);
  return Array.from({ length: n }, () => {
    const at = r() < 0.7 ? pickOf(busy) + Math.floor(r() * HOUR) : T0 + Math.floor(r() * 31 * DAY);
    const outcome = pickOf(OUTCOMES);
    return {
      at: new Date(at),
      tokenId: pickOf(TOKENS),
      userId: 'u1',
      model: pickOf(MODELS),
      adapter: r() < 0.3 ? 'sql-lora' : '',
      node: 'n1',
      replicaId: `r${Math.floor(r() * 3)}`,
      outcome,
      promptTokens: Math.floor(r() * 5000),
      completionTokens: Math.floor(r() * 5000),
      cachedTokens: Math.floor(r() * 100),
      // Whole milliseconds: float sums are then exact whichever order PostgreSQL adds them in.
      ttftMs: r() < 0.8 ? Math.floor(r() * 900) : null,
      // Drawn across the histogram's buckets, so percentiles differ from step to step.
      durationMs: Math.floor(10 ** (1 + r() * 4.5)),
    };
  });
}

/**
 * The direct computation: one GROUP BY over UsageMinute, per step from `from`, as usage() answered before it read
 * rollups (an operator's read: unrestricted).
 */
async function direct(q: { model?: string; token?: string; from: number; to: number; stepMinutes: number }) {
  const stepMs = q.stepMinutes * MINUTE;
  const where = [
    Prisma.sql`"minute" >= (to_timestamp(${q.from / 1000}) AT TIME ZONE 'UTC')
      AND "minute" < (to_timestamp(${q.to / 1000}) AT TIME ZONE 'UTC')`,
  ];
  if (q.model != null) where.push(Prisma.sql`"model" = ${q.model}`);
  if (q.token != null) where.push(Prisma.sql`"tokenId" = ${q.token}`);
  const cells = USAGE_BUCKETS_MS.map((_, i) => Prisma.raw(`sum(coalesce("durationBuckets"[${i + 1}], 0))`));
  const rows = await t.app.db.prisma.$queryRaw<
    {
      bin: number;
      requests: number;
      errors: number;
      aborted: number;
      promptTokens: number;
      completionTokens: number;
      cachedTokens: number;
      ttftMsSum: number;
      ttftCount: number;
      buckets: number[];
    }[]
  >`
    SELECT floor((extract(epoch FROM "minute") * 1000 - ${q.from}) / ${stepMs})::int AS bin,
      sum(requests)::float8 AS requests, sum(errors)::float8 AS errors, sum(aborted)::float8 AS aborted,
      sum("promptTokens")::float8 AS "promptTokens", sum("completionTokens")::float8 AS "completionTokens",
      sum("cachedTokens")::float8 AS "cachedTokens", sum("ttftMsSum")::float8 AS "ttftMsSum",
      sum("ttftCount")::float8 AS "ttftCount", ARRAY[${Prisma.join(cells, ', ')}]::float8[] AS buckets
    FROM "UsageMinute" WHERE ${Prisma.join(where, ' AND ')} GROUP BY 1`;
  return new Map(
    rows.map((row) => [
      row.bin,
      {
        requests: row.requests,
        errors: row.errors,
        aborted: row.aborted,
        promptTokens: row.promptTokens,
        completionTokens: row.completionTokens,
        cachedTokens: row.cachedTokens,
        tokensPerSecond: row.completionTokens / (stepMs / 1000),
        p50Ms: percentileMs(row.buckets, 0.5),
        p95Ms: percentileMs(row.buckets, 0.95),
        meanTtftMs: row.ttftCount > 0 ? row.ttftMsSum / row.ttftCount : null,
      },
    ]),
  );
}

const counts = (p: UsageTotals) => ({
  requests: p.requests,
  errors: p.errors,
  aborted: p.aborted,
  promptTokens: p.promptTokens,
  completionTokens: p.completionTokens,
  cachedTokens: p.cachedTokens,
  p50Ms: p.p50Ms,
  p95Ms: p.p95Ms,
  meanTtftMs: p.meanTtftMs,
});

/** Rows PostgreSQL read from UsageMinute to answer what `run` asks through $queryRaw (EXPLAIN ANALYZE, every loop). */
async function minuteRowsRead(run: () => Promise<unknown>): Promise<number> {
  return rowsRead(run, 'UsageMinute');
}

/** Rows PostgreSQL read from `table` to answer what `run` asks through $queryRaw (EXPLAIN ANALYZE, every loop). */
async function rowsRead(run: () => Promise<unknown>, table: string): Promise<number> {
  const db = t.app.db.prisma;
  const sent: Prisma.Sql[] = [];
  const real = db.$queryRaw.bind(db);
  const spy = vi.spyOn(db, '$queryRaw').mockImplementation(((q: TemplateStringsArray, ...values: unknown[]) => {
    sent.push(Prisma.sql(q, ...values));
    return real(q, ...values);
  }) as typeof db.$queryRaw);
  try {
    await run();
  } finally {
    spy.mockRestore();
  }
  let read = 0;
  for (const q of sent) {
    const [plan] = await db.$queryRaw<{ 'QUERY PLAN': unknown }[]>`EXPLAIN (ANALYZE, FORMAT JSON) ${q}`;
    const walk = (node: Record<string, unknown>) => {
      if (node['Relation Name'] === table) {
        read +=
          (Number(node['Actual Rows']) + Number(node['Rows Removed by Filter'] ?? 0)) * Number(node['Actual Loops']);
      }
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    const [top] = (plan?.['QUERY PLAN'] ?? []) as { Plan: Record<string, unknown> }[];
    if (!top) throw new Error('EXPLAIN gave no plan');
    walk(top.Plan);
  }
  return read;
}

let viewer: Parameters<TestApp['app']['services']['usage']['usage']>[0];
let minuteRows = 0;

beforeAll(async () => {
  t = await startTestApp();
  const admin = await t.app.db.prisma.user.findFirstOrThrow({ where: { role: 'ADMIN' } });
  viewer = {
    kind: 'user',
    user: { id: admin.id, email: admin.email, name: admin.name, role: admin.role },
    role: 'ADMIN',
    sessionId: 'usage-rollup',
  };
  // Four writes of the same mix: the later ones add to minutes the earlier ones wrote.
  const recorder = new UsageRecorder({ db: t.app.db.prisma, log: createLogger('silent') });
  const all = events(6000);
  for (let i = 0; i < 4; i++) {
    for (const e of all.slice(i * 1500, (i + 1) * 1500)) recorder.record(e);
    for (const e of all.slice(0, 300)) recorder.record({ ...e });
    await recorder.flush();
  }
  minuteRows = await t.app.db.prisma.usageMinute.count();
}, 120_000);

afterAll(async () => {
  await t?.close();
});

describe('usage from rollups', () => {
  it('answers every step as the minute-level computation does, over randomised ranges, steps and filters', async () => {
    const usage = t.app.services.usage;
    const steps = [1, 7, 45, 60, 90, 180, 360, 1440];
    let compared = 0;
    for (let round = 0; round < 40; round++) {
      const stepMinutes = pickOf(steps);
      // Ragged and aligned starts both: on the hour, at midnight, or any minute.
      const kind = round % 3;
      const start = T0 + Math.floor(r() * 20 * DAY);
      const from = kind === 0 ? start - (start % DAY) : kind === 1 ? start - (start % HOUR) : start - (start % MINUTE);
      const longest = Math.min(31 * DAY - (from - T0), stepMinutes * MINUTE * 1440);
      const to = from + Math.max(MINUTE, Math.floor(r() * longest)) + (r() < 0.5 ? Math.floor(r() * MINUTE) : 0);
      const model = r() < 0.4 ? pickOf(MODELS) : undefined;
      const token = r() < 0.3 ? pickOf(TOKENS) : undefined;
      const answer = await usage.usage(viewer, {
        model,
        token,
        from: new Date(from),
        to: new Date(to),
        step: stepMinutes,
      });
      if (!answer.ok) throw answer.error;
      const want = await direct({ model, token, from, to, stepMinutes });
      const at = { round, from: new Date(from).toISOString(), to: new Date(to).toISOString(), stepMinutes };
      expect({ ...at, seen: answer.value.points.filter((p) => p.requests > 0).length }).toEqual({
        ...at,
        seen: want.size,
      });
      for (const [bin, p] of answer.value.points.entries()) {
        const w = want.get(bin);
        if (!w) {
          expect({ ...at, bin, requests: p.requests }).toEqual({ ...at, bin, requests: 0 });
          continue;
        }
        expect({ ...at, bin, ...counts(p) }).toEqual({ ...at, bin, ...counts(w) });
        expect(p.tokensPerSecond).toBeCloseTo(w.tokensPerSecond, 9);
        compared++;
      }
    }
    expect(compared).toBeGreaterThan(200);
  });

  it("gives each token's totals as the minute-level computation does", async () => {
    for (const [from, to] of [
      [T0 + 3 * DAY + 17 * MINUTE, T0 + 9 * DAY + 5 * HOUR + 3 * MINUTE],
      [T0, T0 + 31 * DAY],
      [T0 + 30 * DAY - 7 * MINUTE, T0 + 31 * DAY],
    ] as const) {
      const totals = await t.app.services.usage.totalsByToken(viewer, TOKENS, new Date(from), new Date(to));
      if (!totals.ok) throw totals.error;
      for (const token of TOKENS) {
        const want = (await direct({ token, from, to, stepMinutes: Math.ceil((to - from) / MINUTE) })).get(0);
        const got = totals.value.get(token);
        if (!got) throw new Error(`no totals for ${token}`);
        expect({ token, ...counts(got) }).toEqual({
          token,
          ...(want ? counts(want) : counts({ ...got, requests: 0 })),
        });
      }
    }
  });

  it('reads minutes only for the ragged edges of each step', async () => {
    const usage = t.app.services.usage;
    const month = { from: new Date(T0), to: new Date(T0 + 31 * DAY), step: 1440 };
    // A month by day from midnight: days alone.
    expect(await minuteRowsRead(() => usage.usage(viewer, month))).toBe(0);
    // From 10:17: each day's step is 23 whole hours and the minutes around one hour.
    const ragged = { from: new Date(T0 + 10 * HOUR + 17 * MINUTE), to: new Date(T0 + 30 * DAY), step: 1440 };
    expect(await minuteRowsRead(() => usage.usage(viewer, ragged))).toBeLessThan(minuteRows / 6);
    expect(
      await minuteRowsRead(() =>
        usage.totalsByToken(viewer, TOKENS, new Date(T0 + 5 * MINUTE), new Date(T0 + 20 * DAY + 5 * MINUTE)),
      ),
    ).toBeLessThan(minuteRows / 6);
    // And the pieces themselves: a day from 10:17 by day is one range of minutes around 10:00–11:00.
    const p = planPieces(T0 + 10 * HOUR + 17 * MINUTE, T0 + DAY + 10 * HOUR + 17 * MINUTE, DAY);
    expect(p).toEqual({
      minute: [
        [T0 + 10 * HOUR + 17 * MINUTE, T0 + 11 * HOUR],
        [T0 + DAY + 10 * HOUR, T0 + DAY + 10 * HOUR + 17 * MINUTE],
      ],
      hour: [[T0 + 11 * HOUR, T0 + DAY + 10 * HOUR]],
      day: [],
    });
  });

  // The planner picks how to read by how many rows each level keeps per hour (usage-plan.ts); these make it read
  // steps off midnight or the hour one way or the other, whatever this database's statistics say.
  const DENSE: Density = { minute: 1000, hour: 20, day: 1 }; // hours compress: move starts, read the edges
  const SPARSE: Density = { minute: 1, hour: 1, day: 24 }; // nothing compresses: each step's own pieces

  it('answers steps that start off midnight or off the hour the same way, whichever rows it reads', async () => {
    const services = [DENSE, SPARSE].map((density) => new UsageService({ db: t.app.db.prisma, density }));
    const steps = [60, 120, 180, 360, 1440];
    let compared = 0;
    for (let round = 0; round < 24; round++) {
      const stepMinutes = pickOf(steps);
      // Off the hour (any minute), or on an hour that is not midnight.
      const start = T0 + Math.floor(r() * 20 * DAY) + (round % 2 === 0 ? 0 : Math.floor(r() * 23 + 1) * HOUR);
      const from =
        round % 2 === 0 ? start - (start % MINUTE) + (1 + Math.floor(r() * 58)) * MINUTE : start - (start % HOUR);
      const longest = Math.min(31 * DAY - (from - T0), stepMinutes * MINUTE * 200);
      const to = from + Math.max(MINUTE, Math.floor(r() * longest)) + (r() < 0.5 ? Math.floor(r() * MINUTE) : 0);
      const model = r() < 0.3 ? pickOf(MODELS) : undefined;
      const token = r() < 0.3 ? pickOf(TOKENS) : undefined;
      const want = await direct({ model, token, from, to, stepMinutes });
      for (const [which, usage] of services.entries()) {
        const answer = await usage.usage(viewer, {
          model,
          token,
          from: new Date(from),
          to: new Date(to),
          step: stepMinutes,
        });
        if (!answer.ok) throw answer.error;
        const at = { which, round, from: new Date(from).toISOString(), to: new Date(to).toISOString(), stepMinutes };
        for (const [bin, p] of answer.value.points.entries()) {
          const w = want.get(bin);
          expect({ ...at, bin, ...counts(p) }).toEqual({
            ...at,
            bin,
            ...(w
              ? counts(w)
              : counts({
                  ...p,
                  requests: 0,
                  errors: 0,
                  aborted: 0,
                  promptTokens: 0,
                  completionTokens: 0,
                  cachedTokens: 0,
                  p50Ms: null,
                  p95Ms: null,
                  meanTtftMs: null,
                })),
          });
          if (w) compared++;
        }
      }
    }
    expect(compared).toBeGreaterThan(200);
    for (const [from, to] of [
      [T0 + 3 * DAY + 17 * MINUTE, T0 + 9 * DAY + 5 * HOUR + 3 * MINUTE],
      [T0 + 29 * DAY + 10 * HOUR + 17 * MINUTE, T0 + 30 * DAY + 10 * HOUR + 17 * MINUTE],
      [T0 + 6 * HOUR, T0 + 7 * DAY + 22 * HOUR + 59 * MINUTE],
    ] as const) {
      for (const usage of services) {
        const totals = await usage.totalsByToken(viewer, TOKENS, new Date(from), new Date(to));
        if (!totals.ok) throw totals.error;
        for (const token of TOKENS) {
          const w = (await direct({ token, from, to, stepMinutes: Math.ceil((to - from) / MINUTE) })).get(0);
          const got = totals.value.get(token);
          if (!got) throw new Error(`no totals for ${token}`);
          expect({ token, ...counts(got) }).toEqual({ token, ...(w ? counts(w) : counts({ ...got, requests: 0 })) });
        }
      }
    }
  });

  it('reads a month by day from 10:17 as days less the stretch from midnight to 10:17, when hours compress', async () => {
    const ragged = { from: new Date(T0 + 10 * HOUR + 17 * MINUTE), to: new Date(T0 + 30 * DAY), step: 1440 };
    // Each step's own pieces: 23 hours and an hour of minutes a step. Moved to midnight: a day, and once per step
    // the day's prefix to 10:00, the quarter hour from 10:00 and two minutes (each read once, added to one step and
    // taken from the next).
    const plan = planSteps(ragged.from.getTime(), ragged.to.getTime(), DAY, DENSE);
    expect(plan.natural.day).toEqual([[T0, T0 + 30 * DAY]]);
    expect(plan.natural.hour).toEqual([]);
    expect(plan.regions.slice(0, 3)).toEqual([
      { level: 'prefix', span: [T0, T0 + 10 * HOUR], to: [{ bin: 0, sign: -1 }] },
      { level: 'quarter', span: [T0 + 10 * HOUR, T0 + 10 * HOUR + 15 * MINUTE], to: [{ bin: 0, sign: -1 }] },
      {
        level: 'minute',
        span: [T0 + 10 * HOUR + 15 * MINUTE, T0 + 10 * HOUR + 17 * MINUTE],
        to: [{ bin: 0, sign: -1 }],
      },
    ]);
    expect(plan.regions.slice(3, 6)).toEqual([
      {
        level: 'prefix',
        span: [T0 + DAY, T0 + DAY + 10 * HOUR],
        to: [
          { bin: 0, sign: 1 },
          { bin: 1, sign: -1 },
        ],
      },
      {
        level: 'quarter',
        span: [T0 + DAY + 10 * HOUR, T0 + DAY + 10 * HOUR + 15 * MINUTE],
        to: [
          { bin: 0, sign: 1 },
          { bin: 1, sign: -1 },
        ],
      },
      {
        level: 'minute',
        span: [T0 + DAY + 10 * HOUR + 15 * MINUTE, T0 + DAY + 10 * HOUR + 17 * MINUTE],
        to: [
          { bin: 0, sign: 1 },
          { bin: 1, sign: -1 },
        ],
      },
    ]);
    // And what PostgreSQL reads for it: no hour rows, and per step one prefix row per caller of that day (this usage
    // has few minutes near 10:00 to count).
    const [dense, sparse] = [DENSE, SPARSE].map((density) => new UsageService({ db: t.app.db.prisma, density }));
    const read = async (usage: UsageService | undefined, table: string) =>
      rowsRead(() => (usage as UsageService).usage(viewer, ragged), table);
    const hours = [await read(dense, 'UsageHour'), await read(sparse, 'UsageHour')];
    const minutes = [await read(dense, 'UsageMinute'), await read(sparse, 'UsageMinute')];
    expect(hours[0]).toBe(0);
    expect(hours[1]).toBeGreaterThan(0);
    expect(minutes[0]).toBeLessThanOrEqual(minutes[1] as number);
    const prefixes = await t.app.db.prisma.usageDayPrefix.count({
      where: {
        day: { in: Array.from({ length: 30 }, (_, i) => new Date(T0 + i * DAY)) },
        until: { in: Array.from({ length: 30 }, (_, i) => new Date(T0 + i * DAY + 10 * HOUR)) },
      },
    });
    // (EXPLAIN's rows are a per-loop average, rounded: one loop a step.)
    expect(await read(dense, 'UsageDayPrefix')).toBeLessThanOrEqual(prefixes + 30);
  });

  it('answers from the usage written before the day prefixes and quarter hours existed the same way, once their migrations ran', async () => {
    // As a database the migrations meet: UsageMinute and UsageHour filled (by the trigger of before), no
    // UsageDayPrefix or UsageQuarter. The migrations' own files are run, as the server runs them at start
    // (db/migrate.ts).
    const db = t.app.db.prisma;
    const written = { prefixes: await db.usageDayPrefix.count(), quarters: await db.usageQuarter.count() };
    expect(written.prefixes).toBeGreaterThan(0);
    expect(written.quarters).toBeGreaterThan(0);
    const client = new pg.Client({ connectionString: t.app.db.url });
    await client.connect();
    try {
      await client.query('DROP TABLE "UsageDayPrefix", "UsageQuarter"');
      for (const name of ['20261208000100_usage_day_prefix', '20261208000110_usage_quarter']) {
        await client.query(await fs.readFile(path.join(migrationsDir, name, 'migration.sql'), 'utf8'));
      }
    } finally {
      await client.end();
    }
    // The same rows the trigger wrote, and answers that read them (moved starts, DENSE) equal to the minutes'.
    expect({ prefixes: await db.usageDayPrefix.count(), quarters: await db.usageQuarter.count() }).toEqual(written);
    const dense = new UsageService({ db: t.app.db.prisma, density: DENSE });
    let prefixed = 0;
    let quartered = 0;
    for (let round = 0; round < 8; round++) {
      const from = T0 + Math.floor(r() * 20) * DAY + (1 + Math.floor(r() * 22)) * HOUR + Math.floor(r() * 60) * MINUTE;
      const to = from + Math.floor(1 + r() * 9) * DAY;
      const model = round % 3 === 0 ? pickOf(MODELS) : undefined;
      const plan = planSteps(from, to, DAY, DENSE);
      prefixed += plan.regions.filter((g) => g.level === 'prefix').length;
      quartered += plan.regions.filter((g) => g.level === 'quarter').length;
      const answer = await dense.usage(viewer, { model, from: new Date(from), to: new Date(to), step: 1440 });
      if (!answer.ok) throw answer.error;
      const want = await direct({ model, from, to, stepMinutes: 1440 });
      const at = { round, from: new Date(from).toISOString() };
      for (const [bin, p] of answer.value.points.entries()) {
        const w = want.get(bin);
        expect({ ...at, bin, ...counts(p) }).toEqual({ ...at, bin, ...counts(w ?? { ...p, ...NOTHING }) });
      }
    }
    expect(prefixed).toBeGreaterThan(8);
    expect(quartered).toBeGreaterThan(8);
    const [from, to] = [T0 + 29 * DAY + 10 * HOUR + 17 * MINUTE, T0 + 30 * DAY + 10 * HOUR + 17 * MINUTE];
    const totals = await dense.totalsByToken(viewer, TOKENS, new Date(from), new Date(to));
    if (!totals.ok) throw totals.error;
    for (const token of TOKENS) {
      const w = (await direct({ token, from, to, stepMinutes: Math.ceil((to - from) / MINUTE) })).get(0);
      const got = totals.value.get(token);
      if (!got) throw new Error(`no totals for ${token}`);
      expect({ token, ...counts(got) }).toEqual({ token, ...counts(w ?? { ...got, ...NOTHING }) });
    }
  });

  it('adds a late row (a spool a crashed process left, replayed days later) to the hours and days', async () => {
    const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-usage-late-'));
    try {
      const spoolDir = path.join(dataDir, 'usage');
      await fs.mkdir(spoolDir);
      // A file as a process that died (its pid no longer running) leaves it: one second's rows, from day 12.
      const host = os.hostname().replace(/[^A-Za-z0-9_-]/g, '_') || 'host';
      let pid = 4_000_000;
      while (alive(pid)) pid++;
      const minute = new Date(T0 + 12 * DAY + 13 * HOUR + 21 * MINUTE);
      const row = {
        minute: minute.toISOString(),
        tokenId: 'tok-late',
        userId: 'u1',
        model: 'llama-7b',
        adapter: '',
        node: 'n1',
        replicaId: 'r0',
        requests: 7,
        errors: 1,
        aborted: 0,
        promptTokens: 700,
        completionTokens: 70,
        cachedTokens: 0,
        ttftMsSum: 140,
        ttftCount: 7,
        durationMsSum: 7000,
        buckets: USAGE_BUCKETS_MS.map((b) => (b === 1000 ? 7 : 0)),
      };
      await fs.writeFile(
        path.join(spoolDir, `${host}.${pid}.0f3c1a52-5d7e-4c1e-9a4b-1d2e3f405162.ndjson`),
        `${JSON.stringify({ seq: 1, rows: [row] })}\n`,
      );
      const month = { token: 'tok-late', from: new Date(T0), to: new Date(T0 + 31 * DAY), step: 1440 };
      const before = await t.app.services.usage.usage(viewer, month);
      if (!before.ok) throw before.error;
      expect(before.value.totals.requests).toBe(0);

      const next = new UsageRecorder({ db: t.app.db.prisma, log: createLogger('silent'), spoolDir });
      await next.start(1_000_000_000);
      await next.flush();
      await next.stop();

      const hours = await t.app.db.prisma.usageHour.findMany({ where: { tokenId: 'tok-late' } });
      // To its quarter hour (13:15).
      const quarters = await t.app.db.prisma.usageQuarter.findMany({ where: { tokenId: 'tok-late' } });
      expect(quarters.map((q) => [q.quarter.toISOString(), Number(q.requests)])).toEqual([
        [new Date(T0 + 12 * DAY + 13 * HOUR + 15 * MINUTE).toISOString(), 7],
      ]);
      // And to every prefix of day 12 that ends after 13:00: until 14:00, 15:00, … 23:00.
      const prefixes = await t.app.db.prisma.usageDayPrefix.findMany({
        where: { tokenId: 'tok-late' },
        orderBy: { until: 'asc' },
      });
      expect(prefixes.map((p) => [p.day.toISOString(), p.until.toISOString(), Number(p.requests)])).toEqual(
        Array.from({ length: 10 }, (_, i) => [
          new Date(T0 + 12 * DAY).toISOString(),
          new Date(T0 + 12 * DAY + (14 + i) * HOUR).toISOString(),
          7,
        ]),
      );
      const days = await t.app.db.prisma.usageDay.findMany({ where: { tokenId: 'tok-late' } });
      expect(hours.map((h) => [h.hour.toISOString(), Number(h.requests), Number(h.promptTokens)])).toEqual([
        [new Date(T0 + 12 * DAY + 13 * HOUR).toISOString(), 7, 700],
      ]);
      expect(days.map((d) => [d.day.toISOString(), Number(d.requests), d.durationBuckets.map(Number)])).toEqual([
        [new Date(T0 + 12 * DAY).toISOString(), 7, row.buckets],
      ]);
      // The month by day reads days alone: the late row is in its day's point.
      const after = await t.app.services.usage.usage(viewer, month);
      if (!after.ok) throw after.error;
      expect(after.value.points[12]).toMatchObject({ requests: 7, errors: 1, promptTokens: 700, p50Ms: 1000 });
      expect(after.value.totals.requests).toBe(7);
    } finally {
      await fs.rm(dataDir, { recursive: true, force: true });
    }
  });
});

/** A point where nothing was recorded. */
const NOTHING = {
  requests: 0,
  errors: 0,
  aborted: 0,
  promptTokens: 0,
  completionTokens: 0,
  cachedTokens: 0,
  p50Ms: null,
  p95Ms: null,
  meanTtftMs: null,
};

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
