import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { Prisma } from '../generated/prisma/client.js';
import { USAGE_BUCKETS_MS } from './usage.js';
import { percentileMs, type UsageTotals } from './usage.service.js';

// usage() and the Tokens page's totals read every matching row once, whatever the number of steps: checked on
// generated rows against the per-step answer Hangar gave before (PER_STEP_REFERENCE below, the old statement kept
// here as the reference), and in PostgreSQL's own plan (rows read from UsageMinute, over every loop).

let t: TestApp;
const T0 = new Date('2026-11-01T00:00:00Z');
const MINUTE = 60_000;
const DAY = 1440 * MINUTE;
const MODELS = ['llama-7b', 'qwen-1b', 'mistral-7b'];
const TOKENS = ['tok-a', 'tok-b', 'tok-c', ''];

/** A small deterministic generator (mulberry32): the same rows every run, so a failure can be looked at again. */
function random(seed: number) {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Rows over 31 days with histograms drawn from a different latency mix per row, so each step's p50 and p95 fall in
 * different buckets: a sum that added the wrong buckets, or a step's rows to another step, changes a percentile.
 */
function rows(n: number) {
  const r = random(33);
  return Array.from({ length: n }, () => {
    const durationBuckets = USAGE_BUCKETS_MS.map(() => (r() < 0.4 ? Math.floor(r() * 20) : 0));
    const requests = durationBuckets.reduce((a, b) => a + b, 0);
    const ttftCount = Math.floor(requests * r());
    return {
      minute: new Date(T0.getTime() + Math.floor(r() * 31 * 1440) * MINUTE),
      tokenId: TOKENS[Math.floor(r() * TOKENS.length)] as string,
      userId: 'u1',
      model: MODELS[Math.floor(r() * MODELS.length)] as string,
      adapter: r() < 0.3 ? 'sql-lora' : '',
      node: 'n1',
      replicaId: `r${Math.floor(r() * 3)}`,
      requests,
      errors: Math.floor(requests * r() * 0.2),
      aborted: Math.floor(requests * r() * 0.1),
      promptTokens: Math.floor(r() * 5000),
      completionTokens: Math.floor(r() * 5000),
      ttftMsSum: ttftCount * Math.floor(r() * 900),
      ttftCount,
      durationMsSum: requests * 700,
      durationBuckets,
    };
  });
}

/**
 * What usage() asked PostgreSQL before it read in one pass: the histogram summed by a subquery per step. Kept as the
 * reference the one-pass answer must equal (same window and bins; the reads here are an operator's, unrestricted).
 */
async function perStepReference(filter: { model?: string; from: Date; to: Date; stepMinutes: number }) {
  const stepMs = filter.stepMinutes * MINUTE;
  const where = [
    Prisma.sql`"minute" >= (to_timestamp(${filter.from.getTime() / 1000}) AT TIME ZONE 'UTC')
      AND "minute" < (to_timestamp(${filter.to.getTime() / 1000}) AT TIME ZONE 'UTC')`,
  ];
  if (filter.model != null) where.push(Prisma.sql`"model" = ${filter.model}`);
  const bin = Prisma.sql`floor((extract(epoch FROM "minute") * 1000 - ${filter.from.getTime()}) / ${stepMs})::int`;
  const found = await t.app.db.prisma.$queryRaw<
    {
      bin: number;
      requests: number;
      completionTokens: number;
      ttftMsSum: number;
      ttftCount: number;
      buckets: number[] | null;
    }[]
  >`
    WITH r AS (
      SELECT ${bin} AS bin, * FROM "UsageMinute" WHERE ${Prisma.join(where, ' AND ')}
    ), h AS (
      SELECT r.bin, b.i, sum(b.n)::float8 AS n
      FROM r CROSS JOIN LATERAL unnest(r."durationBuckets") WITH ORDINALITY AS b(n, i)
      GROUP BY r.bin, b.i
    )
    SELECT r.bin, sum(r."requests")::float8 AS "requests", sum(r."completionTokens")::float8 AS "completionTokens",
      sum(r."ttftMsSum")::float8 AS "ttftMsSum", sum(r."ttftCount")::float8 AS "ttftCount",
      (SELECT array_agg(h.n ORDER BY h.i) FROM h WHERE h.bin = r.bin) AS buckets
    FROM r GROUP BY r.bin ORDER BY r.bin`;
  return new Map(
    found.map((row) => {
      const buckets = (row.buckets ?? []).map(Number);
      return [
        row.bin,
        {
          requests: row.requests,
          completionTokens: row.completionTokens,
          p50Ms: percentileMs(buckets, 0.5),
          p95Ms: percentileMs(buckets, 0.95),
          meanTtftMs: row.ttftCount > 0 ? row.ttftMsSum / row.ttftCount : null,
        },
      ];
    }),
  );
}

const pick = (p: UsageTotals) => ({
  requests: p.requests,
  completionTokens: p.completionTokens,
  p50Ms: p.p50Ms,
  p95Ms: p.p95Ms,
  meanTtftMs: p.meanTtftMs,
});

/**
 * Rows PostgreSQL read to answer what `run` asks through $queryRaw: from UsageMinute, and from any materialized
 * copy of its rows (a CTE Scan), summed over every scan node and every loop of it (EXPLAIN ANALYZE of the very
 * statement and values the service sent; EXPLAIN gives rows per loop).
 */
async function rowsRead(run: () => Promise<unknown>): Promise<number> {
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
      if (node['Relation Name'] === 'UsageMinute' || node['Node Type'] === 'CTE Scan') {
        const perLoop = Number(node['Actual Rows']) + Number(node['Rows Removed by Filter'] ?? 0);
        read += perLoop * Number(node['Actual Loops']);
      }
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    const [top] = (plan?.['QUERY PLAN'] ?? []) as { Plan: Record<string, unknown> }[];
    if (!top) throw new Error('EXPLAIN gave no plan');
    walk(top.Plan);
  }
  return read;
}

const ROWS = 4000;
let operatorViewer: Parameters<TestApp['app']['services']['usage']['usage']>[0];

beforeAll(async () => {
  t = await startTestApp();
  await t.app.db.prisma.usageMinute.createMany({ data: rows(ROWS), skipDuplicates: true });
  const admin = await t.app.db.prisma.user.findFirstOrThrow({ where: { role: 'ADMIN' } });
  operatorViewer = {
    kind: 'user',
    user: { id: admin.id, email: admin.email, name: admin.name, role: admin.role },
    role: 'ADMIN',
    sessionId: 'usage-one-pass',
  };
}, 120_000);

afterAll(async () => {
  await t?.close();
});

describe('usage in one pass', () => {
  it('gives the per-step answer (sums, p50, p95, mean TTFT) for a month by day and a day by minute', async () => {
    const usage = t.app.services.usage;
    const cases = [
      { from: T0, to: new Date(T0.getTime() + 31 * DAY), stepMinutes: 1440 },
      {
        model: 'llama-7b',
        from: new Date(T0.getTime() + 3 * DAY),
        to: new Date(T0.getTime() + 4 * DAY),
        stepMinutes: 1,
      },
      {
        model: 'qwen-1b',
        from: new Date(T0.getTime() + 5 * DAY),
        to: new Date(T0.getTime() + 12 * DAY),
        stepMinutes: 60,
      },
    ];
    for (const c of cases) {
      const answer = await usage.usage(operatorViewer, { model: c.model, from: c.from, to: c.to, step: c.stepMinutes });
      if (!answer.ok) throw answer.error;
      const reference = await perStepReference(c);
      expect(reference.size).toBeGreaterThan(3);
      const seen = answer.value.points.filter((p) => p.requests > 0);
      expect(seen).toHaveLength(reference.size);
      for (const p of answer.value.points) {
        const bin = Math.round((p.at.getTime() - c.from.getTime()) / (c.stepMinutes * MINUTE));
        const want = reference.get(bin);
        if (!want) expect(p.requests).toBe(0);
        else expect({ bin, ...pick(p) }).toEqual({ bin, ...want });
      }
      // The percentiles are not all the same bucket: a wrong sum would show.
      expect(new Set(seen.map((p) => p.p50Ms)).size).toBeGreaterThan(1);
    }
  });

  it("gives each token's totals as the per-step reference does over the whole range", async () => {
    const from = T0;
    const to = new Date(T0.getTime() + 31 * DAY);
    const totals = await t.app.services.usage.totalsByToken(operatorViewer, TOKENS, from, to);
    if (!totals.ok) throw totals.error;
    for (const id of TOKENS) {
      const [want] = await t.app.db.prisma.$queryRaw<{ requests: number; buckets: number[] }[]>`
        WITH h AS (
          SELECT b.i, sum(b.n)::float8 AS n FROM "UsageMinute" u
          CROSS JOIN LATERAL unnest(u."durationBuckets") WITH ORDINALITY AS b(n, i)
          WHERE u."tokenId" = ${id} GROUP BY b.i
        )
        SELECT (SELECT sum(requests)::float8 FROM "UsageMinute" WHERE "tokenId" = ${id}) AS requests,
          (SELECT array_agg(n ORDER BY i) FROM h) AS buckets`;
      const got = totals.value.get(id);
      expect({ id, requests: got?.requests, p50: got?.p50Ms, p95: got?.p95Ms }).toEqual({
        id,
        requests: want?.requests,
        p50: percentileMs(want?.buckets ?? [], 0.5),
        p95: percentileMs(want?.buckets ?? [], 0.95),
      });
    }
  });

  it('reads each matching row once, however many steps the answer has', async () => {
    const usage = t.app.services.usage;
    const from = T0;
    const to = new Date(T0.getTime() + 31 * DAY);
    // Every row is in the range: one pass reads ROWS rows; a subquery per step would read them once per step.
    expect(await rowsRead(() => usage.usage(operatorViewer, { from, to, step: 1440 }))).toBeLessThanOrEqual(ROWS);
    expect(await rowsRead(() => usage.usage(operatorViewer, { from, to, step: 31 }))).toBeLessThanOrEqual(ROWS);
    expect(await rowsRead(() => usage.totalsByToken(operatorViewer, TOKENS, from, to))).toBeLessThanOrEqual(ROWS);
  });
});

describe('ApiToken.usage', () => {
  it('accepts the 31 days it is documented to cover, and refuses 32', async () => {
    const admin = await t.login();
    await t.token('OPERATOR', 'month-script');
    const token = await t.app.db.prisma.apiToken.findFirstOrThrow({ where: { name: 'month-script' } });
    // Used 20 days before the end of the month asked for: outside any 24 hours, inside the 31 days.
    await t.app.db.prisma.usageMinute.create({
      data: {
        minute: new Date(T0.getTime() + 11 * DAY),
        tokenId: token.id,
        userId: token.userId,
        model: 'llama-7b',
        requests: 9,
        durationBuckets: USAGE_BUCKETS_MS.map((b) => (b === 250 ? 9 : 0)),
      },
    });
    const query = `query($from: DateTime!, $to: DateTime!) {
      apiTokens(all: true) { name usage(from: $from, to: $to) { __typename ... on UsageTotals { requests } ... on ValidationError { field message } } }
    }`;
    const month = await t.gql(
      query,
      { from: T0.toISOString(), to: new Date(T0.getTime() + 31 * DAY).toISOString() },
      admin,
    );
    expect(month.errors).toBeUndefined();
    const tokens = (month.data?.apiTokens ?? []) as { name: string; usage: unknown }[];
    expect(tokens.find((tk) => tk.name === 'month-script')?.usage).toEqual({ __typename: 'UsageTotals', requests: 9 });
    const tooLong = await t.gql(
      query,
      { from: T0.toISOString(), to: new Date(T0.getTime() + 32 * DAY).toISOString() },
      admin,
    );
    const refused = (tooLong.data?.apiTokens ?? []) as { usage: unknown }[];
    expect(refused.length).toBeGreaterThan(0);
    for (const tk of refused) {
      expect(tk.usage).toEqual({
        __typename: 'ValidationError',
        field: 'from',
        message: 'from is 32.0 days before to; at most 31: ask for a shorter range, or for several',
      });
    }
  });
});
