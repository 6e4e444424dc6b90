// The kinds of limit and the windows they are counted in. Windows are cut on the database's clock (db/clock.ts),
// the same in every server process, so two processes counting "this minute" count the same minute, and a day or a
// month is a UTC day or month: a budget resets at the same instant for everybody, whatever a server's timezone.

export const LIMIT_KINDS = [
  'requestsPerMinute',
  'tokensPerMinute',
  'concurrentRequests',
  'tokensPerDay',
  'tokensPerMonth',
  'spendPerMonth',
] as const;
export type LimitKind = (typeof LIMIT_KINDS)[number];

/** What a kind counts: requests, requests at once, tokens (prompt + completion) or money (millionths of a unit). */
export type Unit = 'requests' | 'slots' | 'tokens' | 'money';

export const UNIT: Record<LimitKind, Unit> = {
  requestsPerMinute: 'requests',
  tokensPerMinute: 'tokens',
  concurrentRequests: 'slots',
  tokensPerDay: 'tokens',
  tokensPerMonth: 'tokens',
  spendPerMonth: 'money',
};

/**
 * A rate is refused as OpenAI refuses one ("rate_limit_exceeded": wait and retry); a budget for a day or a month
 * as OpenAI refuses a plan's quota ("insufficient_quota": retrying soon will not help).
 */
export const IS_QUOTA: Record<LimitKind, boolean> = {
  requestsPerMinute: false,
  tokensPerMinute: false,
  concurrentRequests: false,
  tokensPerDay: true,
  tokensPerMonth: true,
  spendPerMonth: true,
};

/** As people read them in a refusal: "requests per minute". */
export const KIND_WORDS: Record<LimitKind, string> = {
  requestsPerMinute: 'requests per minute',
  tokensPerMinute: 'tokens per minute',
  concurrentRequests: 'requests at once',
  tokensPerDay: 'tokens per day',
  tokensPerMonth: 'tokens per month',
  spendPerMonth: 'spend per month',
};

/** Money is counted in millionths of the currency's unit: a token's price per million tokens is then exact. */
export const MONEY_SCALE = 1_000_000;

export type Window = { start: number; end: number };

/** Concurrency has one window for ever: its slots are taken and given back, never reset. */
const FOREVER: Window = { start: 0, end: Number.POSITIVE_INFINITY };

/** The window of `kind` that holds `nowMs`; `minuteMs` is HANGAR_LIMIT_MINUTE_SECONDS (60 s but in tests). */
export function windowOf(kind: LimitKind, nowMs: number, minuteMs: number): Window {
  switch (kind) {
    case 'requestsPerMinute':
    case 'tokensPerMinute': {
      const start = Math.floor(nowMs / minuteMs) * minuteMs;
      return { start, end: start + minuteMs };
    }
    case 'concurrentRequests':
      return FOREVER;
    case 'tokensPerDay': {
      const start = Math.floor(nowMs / 86_400_000) * 86_400_000;
      return { start, end: start + 86_400_000 };
    }
    case 'tokensPerMonth':
    case 'spendPerMonth': {
      const d = new Date(nowMs);
      const start = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
      return { start, end: Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) };
    }
  }
}

/** A wait as OpenAI writes it in x-ratelimit-reset-*: "20ms", "6s", "1m30s", "2h0m5s". */
export function openAiDuration(ms: number): string {
  if (!Number.isFinite(ms)) return '0s';
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`;
  let s = Math.ceil(ms / 1000);
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (h) return `${h}h${m}m${s}s`;
  if (m) return `${m}m${s}s`;
  return `${s}s`;
}
