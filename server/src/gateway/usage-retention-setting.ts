import type { Horizons } from './usage-rollup.js';

// How long usage is kept at each grain (HANGAR_USAGE_RETENTION, #33): the minutes are most of the rows and the
// reason the table grew for ever; the hours and days (usage-rollup.ts) keep answering for the ranges the minutes no
// longer cover, at their grain. The setting alone, without the database: config-schema.ts reads it at start.

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

/** Milliseconds each grain is kept; Infinity: for ever. */
export type UsageRetention = Record<'minutes' | 'hours' | 'days', number>;

/**
 * Per minute for 93 days: a cost report (up to 92 days) divides each minute's GPU time among that minute's calls,
 * so it reads minutes. Per hour for 400 days, per day for ever (a row per caller, model and replica a day).
 */
export const DEFAULT_USAGE_RETENTION = 'minutes=93d,hours=400d,days=forever';

const GRAINS = ['minutes', 'hours', 'days'] as const;
const FORMAT = `grain=age pairs separated by commas, such as ${DEFAULT_USAGE_RETENTION} (grains minutes, hours, days; ages in whole days, "d", or "forever")`;

/**
 * Reads "minutes=7d,hours=90d,days=forever". A grain left out keeps its default. Returns the retention, or what
 * is wrong (naming the part) as a string.
 */
export function parseUsageRetention(text: string): UsageRetention | string {
  const kept: UsageRetention = { minutes: 93 * DAY_MS, hours: 400 * DAY_MS, days: Number.POSITIVE_INFINITY };
  const seen = new Set<string>();
  for (const raw of text.split(',')) {
    const part = raw.trim();
    if (!part) continue;
    const m = /^([a-z]+)\s*=\s*(\d+d|forever)$/i.exec(part);
    const grain = m?.[1]?.toLowerCase() as (typeof GRAINS)[number] | undefined;
    if (!m || !grain || !GRAINS.includes(grain)) {
      return `"${part}" is not understood: ${FORMAT}`;
    }
    if (seen.has(grain)) return `"${part}": ${grain} is given twice; give each grain once`;
    seen.add(grain);
    const age = (m[2] as string).toLowerCase();
    kept[grain] = age === 'forever' ? Number.POSITIVE_INFINITY : Number(age.slice(0, -1)) * DAY_MS;
  }
  // A day of minutes at least: the spend budgets' prices read the last day of calls per minute (cost.service.ts).
  if (kept.minutes < DAY_MS) return `minutes=${kept.minutes / DAY_MS}d is too short: at least 1d (${FORMAT})`;
  if (kept.hours < kept.minutes) {
    return `hours=${show(kept.hours)} is shorter than minutes=${show(kept.minutes)}: a coarser grain is kept at least as long (${FORMAT})`;
  }
  if (kept.days < kept.hours) {
    return `days=${show(kept.days)} is shorter than hours=${show(kept.hours)}: a coarser grain is kept at least as long (${FORMAT})`;
  }
  return kept;
}

const show = (ms: number) => (Number.isFinite(ms) ? `${ms / DAY_MS}d` : 'forever');

/**
 * From when each grain is kept at `nowMs`, aligned to the next grain up (the minutes to their hour, the hours to
 * their day) so what is older reads from whole rows of the coarser grain. The loop prunes before these, and a
 * query at a later time reads after its own, later ones: never a row being pruned.
 */
export function horizonsAt(retention: UsageRetention, nowMs: number): Horizons & { daysFrom: number } {
  const from = (kept: number, unit: number) =>
    Number.isFinite(kept) ? Math.floor((nowMs - kept) / unit) * unit : Number.NEGATIVE_INFINITY;
  return {
    minutesFrom: from(retention.minutes, HOUR_MS),
    hoursFrom: from(retention.hours, DAY_MS),
    daysFrom: from(retention.days, DAY_MS),
  };
}
