import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../../test/harness.js';
import { loadConfig } from '../config.js';
import { type UsageEvent, UsageRecorder } from './usage.js';
import { parseUsageRetention } from './usage-retention-setting.js';

// HANGAR_USAGE_RETENTION: how it is read (and refused, naming the part), and the loop that prunes minutes and hours
// past it, on a real PostgreSQL, with usage recorded through the recorder. Ranges the minutes no longer cover are
// answered from the hours and days as they were before the pruning.

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

describe('HANGAR_USAGE_RETENTION', () => {
  it('reads grain=age pairs, keeps the defaults for the grains left out, and refuses a bad part by name', () => {
    expect(parseUsageRetention('minutes=7d,hours=90d,days=forever')).toEqual({
      minutes: 7 * DAY,
      hours: 90 * DAY,
      days: Number.POSITIVE_INFINITY,
    });
    expect(parseUsageRetention('minutes=30d')).toEqual({
      minutes: 30 * DAY,
      hours: 400 * DAY,
      days: Number.POSITIVE_INFINITY,
    });
    expect(loadConfig({}).usageRetention).toEqual({
      minutes: 93 * DAY,
      hours: 400 * DAY,
      days: Number.POSITIVE_INFINITY,
    });
    expect(parseUsageRetention('minutes=7d,secs=3d')).toMatch(/^"secs=3d" is not understood: grain=age pairs/);
    expect(parseUsageRetention('minutes=7 days')).toMatch(/^"minutes=7 days" is not understood/);
    expect(parseUsageRetention('minutes=7d,minutes=8d')).toMatch(/^"minutes=8d": minutes is given twice/);
    expect(parseUsageRetention('minutes=0d')).toMatch(/^minutes=0d is too short: at least 1d/);
    expect(parseUsageRetention('minutes=30d,hours=7d')).toMatch(
      /^hours=7d is shorter than minutes=30d: a coarser grain is kept at least as long/,
    );
    expect(parseUsageRetention('hours=forever,days=90d')).toMatch(/^days=90d is shorter than hours=forever/);
    expect(() => loadConfig({ HANGAR_USAGE_RETENTION: 'minutes=1w' })).toThrow(
      /HANGAR_USAGE_RETENTION="minutes=1w" is not accepted: "minutes=1w" is not understood: grain=age pairs separated by commas, such as minutes=93d,hours=400d,days=forever/,
    );
  });
});

describe('pruning usage past its retention', () => {
  let t: TestApp;
  let viewer: Parameters<TestApp['app']['services']['usage']['usage']>[0];
  let now: number;

  beforeAll(async () => {
    t = await startTestApp({ HANGAR_USAGE_RETENTION: 'minutes=2d,hours=5d' });
    const admin = await t.app.db.prisma.user.findFirstOrThrow({ where: { role: 'ADMIN' } });
    viewer = {
      kind: 'user',
      user: { id: admin.id, email: admin.email, name: admin.name, role: admin.role },
      role: 'ADMIN',
      sessionId: 'usage-retention',
    };
    now = t.app.db.prisma.clock.nowMs();
    // Usage every 37 minutes over 20 days, through the recorder as the gateway records it.
    const recorder = new UsageRecorder({ db: t.app.db.prisma, log: createLogger('silent') });
    for (let at = now - 20 * DAY; at < now; at += 37 * MINUTE) {
      const event: UsageEvent = {
        at: new Date(at),
        tokenId: at % 2 ? 'tok-a' : 'tok-b',
        userId: admin.id,
        model: 'llama-7b',
        adapter: '',
        node: 'n1',
        replicaId: 'r1',
        outcome: 'ok',
        promptTokens: 100,
        completionTokens: Math.floor(at / MINUTE) % 97,
        ttftMs: 40,
        durationMs: 10 ** (1 + ((at / MINUTE) % 4)),
      };
      recorder.record(event);
    }
    await recorder.flush();
  }, 120_000);

  afterAll(async () => {
    await t?.close();
  });

  it('deletes minutes and hours past their retention, and answers those ranges from the hours and days', async () => {
    const db = t.app.db.prisma;
    const usage = t.app.services.usage;
    const midnight = now - (now % DAY);
    const month = { from: new Date(midnight - 25 * DAY), to: new Date(now), step: 1440 };
    // Four days ago, from 10:17 (the minute) by hour: the hour of 10:00 on, once the minutes are gone.
    const ragged = now - 4 * DAY - (now % HOUR) + 17 * MINUTE;
    const byHour = { from: new Date(ragged - (ragged % HOUR)), to: new Date(now), step: 60 };
    const before = {
      month: await usage.usage(viewer, month),
      byHour: await usage.usage(viewer, byHour),
      tokens: await usage.totalsByToken(viewer, ['tok-a', 'tok-b'], month.from, month.to),
    };
    const minutesBefore = await db.usageMinute.count();

    const deleted = await usage.pruner.prune();

    const minutesKept = now - 2 * DAY - ((now - 2 * DAY) % HOUR);
    const hoursKept = now - 5 * DAY - ((now - 5 * DAY) % DAY);
    expect(await db.usageMinute.count({ where: { minute: { lt: new Date(minutesKept) } } })).toBe(0);
    expect(await db.usageHour.count({ where: { hour: { lt: new Date(hoursKept) } } })).toBe(0);
    // Quarter hours go with the minutes, the day prefixes (sums of hours) with the hours; the later ones stay.
    expect(await db.usageQuarter.count({ where: { quarter: { lt: new Date(minutesKept) } } })).toBe(0);
    expect(await db.usageQuarter.count()).toBeGreaterThan(0);
    // The day prefixes (sums of hours) go with the hours; the later ones stay.
    expect(await db.usageDayPrefix.count({ where: { day: { lt: new Date(hoursKept) } } })).toBe(0);
    expect(await db.usageDayPrefix.count()).toBeGreaterThan(0);
    expect(await db.usageMinute.count()).toBeLessThan(minutesBefore / 5);
    expect(await db.usageDay.count({ where: { day: { lt: new Date(now - 19 * DAY) } } })).toBeGreaterThan(0);
    expect(deleted).toBeGreaterThan(minutesBefore / 2);

    // The same answers, from the hours and days.
    expect(await usage.usage(viewer, month)).toEqual(before.month);
    expect(await usage.totalsByToken(viewer, ['tok-a', 'tok-b'], month.from, month.to)).toEqual(before.tokens);
    const fromMinute = await usage.usage(viewer, { ...byHour, from: new Date(ragged) });
    expect(fromMinute).toEqual(before.byHour);
    if (!fromMinute.ok) throw fromMinute.error;
    expect(fromMinute.value.totals.requests).toBeGreaterThan(100);

    // A step the hours cannot make up is refused, saying from when minutes are kept and what to ask instead.
    const refused = await usage.usage(viewer, { from: new Date(ragged), to: new Date(ragged + DAY), step: 1 });
    expect(refused.ok).toBe(false);
    if (refused.ok) return;
    expect(refused.error).toMatchObject({ field: 'step' });
    expect(refused.error.message).toBe(
      `before ${new Date(minutesKept).toISOString()} usage is kept per hour (HANGAR_USAGE_RETENTION): a step of 1 minutes splits its hours; use a step of whole hours (60, 120, … minutes), or a from after ${new Date(minutesKept).toISOString()}`,
    );
    // A cost report divides each minute among its calls: one reaching past the minutes kept is refused.
    const cost = await t.app.services.cost.report(viewer, { from: new Date(now - 4 * DAY), to: new Date(now) });
    expect(cost.ok).toBe(false);
    if (!cost.ok) expect(cost.error).toMatchObject({ field: 'from' });
  });
});
