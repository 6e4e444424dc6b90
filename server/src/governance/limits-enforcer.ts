import type { Logger } from '@hangar/common/log';
import { isDatabaseUnreachable } from '../db/outage.js';
import type { Reach } from '../org/org.service.js';
import type { LimitLedger, WindowKey } from './limits-ledger.js';
import {
  IS_QUOTA,
  KIND_WORDS,
  type LimitKind,
  MONEY_SCALE,
  openAiDuration,
  UNIT,
  type Window,
  windowOf,
} from './limits-windows.js';
import type { Pricing } from './pricing.js';

// The request path's side of limits: every limit that applies to a request is checked in memory, against the
// slice of its budget this process holds; only when a slice runs out does it go to PostgreSQL for another
// (limits-ledger.ts), and what it did not use it gives back. So a request costs no database round-trip, and
// several processes share one budget without ever granting more than it holds.
//
// A request reserves its worst case before it is sent (its prompt, bounded from above, plus max_tokens, or the
// model's whole context when it sets none) and settles to what it was actually sent when it ends: a stream
// counted to its last token, a client that left mid-stream charged what reached it (the gateway's usage taps).
// What was reserved and not used goes back into the slice at once, and to PostgreSQL when the slice is idle.
//
// With the database away, slices already held keep being spent and nothing more is granted: a caller is refused
// once this process's share is gone, never let through unlimited.

export type LimitRule = {
  id: string;
  /** The owner key, "team:<uuid>". */
  scope: string;
  /** For people: "team:acme/research". */
  label: string;
  /** A model or adapter name; '' for every one. */
  model: string;
  /** Each kind set; spendPerMonth in millionths of the currency (MONEY_SCALE). */
  values: Partial<Record<LimitKind, number>>;
};

/** Who asks and for what, as the gateway knows it after identifying the caller and finding the model. */
export type LimitAsk = {
  tokenId: string;
  userId: string;
  reach: Reach;
  batch: boolean;
  model: string;
  adapter?: string;
  body: Record<string, unknown>;
  /** The model's context in tokens (CatalogModel.contextSize); null when unknown (DEFAULT_CONTEXT). */
  contextSize: number | null;
  /** POST /v1/embeddings: nothing is generated. */
  embeddings?: boolean;
};

export type Refusal = {
  status: 429;
  type: 'rate_limit_exceeded' | 'insufficient_quota';
  code: 'rate_limit_exceeded' | 'insufficient_quota';
  message: string;
  retryAfterMs: number;
  /** A quota that resets in days, or a request larger than the whole limit: retrying soon will not help. */
  retryUseless: boolean;
  headers: Record<string, string>;
};

export type Settled = { promptTokens: number; completionTokens: number } | null;

/**
 * The reservation of one admitted request. charge() adds what a try of it delivered (a fallback model's try too),
 * release() gives back the reservation once it has ended: called in that order, nothing reserved is freed before
 * what was used is counted.
 */
export type Ticket = { charge(usage: Settled): void; release(): void; headers: Record<string, string> };

const NO_TICKET: Ticket = { charge: () => {}, release: () => {}, headers: {} };

/** A model whose context Hangar does not know is assumed to hold this many tokens (llama.cpp's usual default). */
export const DEFAULT_CONTEXT = 8192;
/** A slice is this share of a limit at least: a tenth, so ten processes can each hold one before any waits. */
const SLICES = 10;
/** How often slices are settled to PostgreSQL; one unused for IDLE_MS is given back whole. */
const FLUSH_MS = 500;
const IDLE_MS = 1000;
/** A batch request may not take the last tenth of a budget: under pressure, it is refused before interactive ones. */
const BATCH_SHARE = 0.9;
/** Tokens a chat template may add around each message, and around the whole prompt (see promptBound). */
const TEMPLATE_PER_MESSAGE = 8;
const TEMPLATE_FIXED = 32;

type Bucket = {
  key: WindowKey;
  rule: LimitRule;
  kind: LimitKind;
  window: Window;
  /** Granted to this process and not yet settled. */
  held: number;
  /** Settled by requests here and not yet reported to PostgreSQL. */
  spent: number;
  /** Reserved by requests in flight here. */
  reserved: number;
  /** PostgreSQL's totals as last seen (at a lease or a settlement). */
  seenUsed: number;
  seenLeased: number;
  leasing: Promise<void> | undefined;
  /** Until when no lease is tried again (the last one could not reach the database): refused at once meanwhile. */
  leaseFailedUntil: number;
  lastActive: number;
};

/** After a lease that could not reach the database, the next is tried this much later (a request meanwhile is refused at once). */
const LEASE_RETRY_MS = 1000;

type Need = { bucket: Bucket; amount: number };

export type LimitEnforcerDeps = {
  ledger: LimitLedger;
  log: Logger;
  /** The database's clock (db/clock.ts): windows are cut on it, alike in every process. */
  nowMs: () => number;
  /** HANGAR_LIMIT_MINUTE_SECONDS × 1000. */
  minuteMs: number;
  /** Prices per million tokens, for spendPerMonth; absent, spend counts nothing. */
  pricing?: () => Pricing | undefined;
  /** Told of each refusal, for the audit log's per-minute counts (limits.service.ts). */
  onRefused?: (rule: LimitRule, kind: LimitKind, caller: { tokenId: string; userId: string }) => void;
};

export class LimitEnforcer {
  private byScope = new Map<string, LimitRule[]>();
  private applicableCache = new WeakMap<Reach, Map<string, LimitRule[]>>();
  private readonly buckets = new Map<string, Bucket>();
  private readonly refusals = new Map<string, { rule: LimitRule; kind: LimitKind; count: number }>();
  private timer: NodeJS.Timeout | undefined;
  private flushing: Promise<void> | undefined;
  private lastPrune = 0;

  constructor(private readonly deps: LimitEnforcerDeps) {}

  /** The rules in force, replaced whole (limits.service.ts reads them at start and on every `limits` event). */
  setRules(rules: LimitRule[]) {
    const byScope = new Map<string, LimitRule[]>();
    for (const r of rules) {
      const list = byScope.get(r.scope) ?? [];
      list.push(r);
      byScope.set(r.scope, list);
    }
    this.byScope = byScope;
    this.applicableCache = new WeakMap();
    // A removed limit's slices go back on the next flush; its buckets are not used again.
    const ids = new Set(rules.map((r) => r.id));
    for (const b of this.buckets.values()) if (!ids.has(b.rule.id)) b.lastActive = 0;
  }

  rules(): LimitRule[] {
    return [...this.byScope.values()].flat();
  }

  start() {
    this.timer = setInterval(() => void this.flush(false), FLUSH_MS);
    this.timer.unref();
  }

  /** Settles and gives back every slice (a process going away must not keep its share until the window ends). */
  async stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.flushing;
    await this.flush(true).catch(() => {});
  }

  /** Every limit that applies to a caller and a model: the key's, its user's, each team, project and org it is in. */
  applicable(ask: Pick<LimitAsk, 'tokenId' | 'userId' | 'reach' | 'model' | 'adapter'>): LimitRule[] {
    if (!this.byScope.size) return [];
    let perReach = this.applicableCache.get(ask.reach);
    if (!perReach) {
      perReach = new Map();
      this.applicableCache.set(ask.reach, perReach);
    }
    const cacheKey = `${ask.tokenId}\n${ask.userId}\n${ask.model}\n${ask.adapter ?? ''}`;
    let found = perReach.get(cacheKey);
    if (found) return found;
    found = [];
    const scopes = [`user:${ask.userId}`];
    if (ask.tokenId) scopes.push(`key:${ask.tokenId}`);
    for (const scope of ['org', 'team', 'project'] as const)
      for (const id of ask.reach[scope]) scopes.push(`${scope}:${id}`);
    for (const scope of scopes)
      for (const r of this.byScope.get(scope) ?? [])
        if (r.model === '' || r.model === ask.model || (ask.adapter && r.model === ask.adapter)) found.push(r);
    perReach.set(cacheKey, found);
    return found;
  }

  /**
   * Reserves what the request may use under every limit that applies, or says which limit refuses it. Resolves
   * at once when this process's slices cover it; otherwise after asking PostgreSQL for more.
   */
  async admit(ask: LimitAsk): Promise<{ ok: true; ticket: Ticket } | { ok: false; refusal: Refusal }> {
    const rules = this.applicable(ask);
    if (!rules.length) return { ok: true, ticket: NO_TICKET };
    const now = this.deps.nowMs();
    // An adapter runs on its model's replicas: it costs what its model costs.
    const price = this.deps.pricing?.()?.perMillionTokens(ask.model);
    const worst = worstCase(ask);
    const needs: Need[] = [];
    for (const rule of rules) {
      for (const kind of Object.keys(rule.values) as LimitKind[]) {
        const cap = rule.values[kind];
        if (cap === undefined) continue;
        const amount = amountOf(kind, worst, price);
        if (kind === 'spendPerMonth' && amount === 0) continue; // free: nothing to hold
        needs.push({ bucket: this.bucket(rule, kind, now), amount });
      }
    }
    // A request larger than a whole limit can never pass it: said at once, and retrying will not help.
    for (const n of needs) {
      const cap = this.cap(n.bucket, ask.batch);
      if (n.amount > cap) return { ok: false, refusal: this.refuse(n, ask, now, 'too large') };
    }
    for (let round = 0; ; round++) {
      const short = needs.filter((n) => !this.fits(n, ask.batch));
      if (!short.length) break;
      if (round === 1) return { ok: false, refusal: this.refuse(short[0] as Need, ask, now, 'spent') };
      await Promise.all(short.map((n) => this.topUp(n.bucket, n.amount - this.available(n.bucket))));
    }
    for (const n of needs) {
      n.bucket.reserved += n.amount;
      n.bucket.lastActive = now;
    }
    let released = false;
    let charged = false;
    const ticket: Ticket = {
      headers: this.headersFor(
        needs.map((n) => n.bucket),
        now,
      ),
      charge: (usage) => {
        for (const n of needs) {
          // A request counts once however many tries it took; its tokens as every try delivered them.
          const used = usedOf(n.bucket.kind, usage, price);
          n.bucket.spent += UNIT[n.bucket.kind] === 'requests' ? (charged ? 0 : used) : used;
        }
        charged = true;
      },
      release: () => {
        if (released) return;
        released = true;
        const at = this.deps.nowMs();
        for (const n of needs) {
          n.bucket.reserved -= n.amount;
          // A request refused before any try (or whose tries all failed early) is still a request.
          if (!charged && UNIT[n.bucket.kind] === 'requests') n.bucket.spent += 1;
          n.bucket.lastActive = at;
        }
      },
    };
    return { ok: true, ticket };
  }

  /** OpenAI's x-ratelimit-* headers for a caller without reserving anything (GET /v1/models). */
  peek(ask: Pick<LimitAsk, 'tokenId' | 'userId' | 'reach' | 'model'>): Record<string, string> {
    const rules = this.applicable(ask);
    if (!rules.length) return {};
    const now = this.deps.nowMs();
    const buckets: Bucket[] = [];
    for (const rule of rules)
      for (const kind of Object.keys(rule.values) as LimitKind[])
        if (rule.values[kind] !== undefined) buckets.push(this.bucket(rule, kind, now));
    return this.headersFor(buckets, now);
  }

  /** What is left of each limit's current window as this process sees it, for /metrics and the Limits page. */
  remaining(): { rule: LimitRule; kind: LimitKind; limit: number; used: number; remaining: number; resetAt: number }[] {
    const now = this.deps.nowMs();
    const out = [];
    for (const rule of this.rules())
      for (const kind of Object.keys(rule.values) as LimitKind[]) {
        const limit = rule.values[kind];
        if (limit === undefined) continue;
        const b = this.buckets.get(bucketKey(rule, kind, windowOf(kind, now, this.deps.minuteMs)));
        const used = b ? this.usedEstimate(b) : 0;
        out.push({
          rule,
          kind,
          limit,
          used,
          remaining: Math.max(0, limit - used),
          resetAt: windowOf(kind, now, this.deps.minuteMs).end,
        });
      }
    return out;
  }

  /** Refusals since this process started, by limit and kind (counters for /metrics). */
  refusalCounts(): { rule: LimitRule; kind: LimitKind; count: number }[] {
    return [...this.refusals.values()];
  }

  private bucket(rule: LimitRule, kind: LimitKind, now: number): Bucket {
    const window = windowOf(kind, now, this.deps.minuteMs);
    const key = bucketKey(rule, kind, window);
    let b = this.buckets.get(key);
    if (!b) {
      b = {
        key: { limitId: rule.id, kind, start: new Date(window.start) },
        rule,
        kind,
        window,
        held: 0,
        spent: 0,
        reserved: 0,
        seenUsed: 0,
        seenLeased: 0,
        leasing: undefined,
        leaseFailedUntil: 0,
        lastActive: now,
      };
      this.buckets.set(key, b);
    }
    b.rule = rule;
    return b;
  }

  private cap(b: Bucket, batch: boolean): number {
    const cap = b.rule.values[b.kind] ?? 0;
    return batch ? Math.floor(cap * BATCH_SHARE) : cap;
  }

  private available(b: Bucket): number {
    return b.held - b.spent - b.reserved;
  }

  /** The window's use across every process, as far as this one knows: settled, others' slices, and its own use. */
  private usedEstimate(b: Bucket): number {
    return b.seenUsed + Math.max(0, b.seenLeased - b.held) + b.spent + b.reserved;
  }

  private fits(n: Need, batch: boolean): boolean {
    if (this.available(n.bucket) < n.amount) return false;
    // A batch request leaves the last tenth of every budget to interactive ones.
    return !batch || this.usedEstimate(n.bucket) + n.amount <= this.cap(n.bucket, true);
  }

  /** One lease at a time per bucket: the requests short of it wait for that one, then look again. */
  private async topUp(b: Bucket, shortfall: number): Promise<void> {
    if (b.leasing) return b.leasing;
    if (Date.now() < b.leaseFailedUntil) return;
    const cap = this.cap(b, false);
    const want = Math.max(shortfall, Math.ceil(cap / SLICES), 1);
    b.leasing = (async () => {
      try {
        const lease = await this.deps.ledger.lease(b.key, want, cap);
        b.held += lease.granted;
        b.seenUsed = lease.used;
        b.seenLeased = lease.leased;
        b.leaseFailedUntil = 0;
      } catch (err) {
        b.leaseFailedUntil = Date.now() + LEASE_RETRY_MS;
        // With the database away no more is granted: the slice held is all this process may spend.
        if (!isDatabaseUnreachable(err)) this.deps.log.error('limits: could not lease a slice', { error: err });
      } finally {
        b.leasing = undefined;
      }
    })();
    return b.leasing;
  }

  private refuse(n: Need, ask: LimitAsk, now: number, why: 'too large' | 'spent'): Refusal {
    const { bucket: b, amount } = n;
    const { rule, kind } = b;
    const counted = this.refusals.get(`${rule.id}|${kind}`);
    if (counted) counted.count++;
    else this.refusals.set(`${rule.id}|${kind}`, { rule, kind, count: 1 });
    this.deps.onRefused?.(rule, kind, ask);
    const quota = IS_QUOTA[kind];
    const cap = rule.values[kind] ?? 0;
    const unit = UNIT[kind];
    const show = (v: number) => (unit === 'money' ? (v / MONEY_SCALE).toFixed(2) : String(v));
    const on = `${KIND_WORDS[kind]} (${kind}) of ${rule.label}${rule.model ? ` for ${rule.model}` : ''}`;
    const resetMs = kind === 'concurrentRequests' ? 1000 : Math.max(1, b.window.end - now);
    let message: string;
    let retryUseless = quota;
    if (why === 'too large') {
      retryUseless = true;
      message =
        `This request may use up to ${show(amount)} ${unit === 'money' ? 'of spend' : unit}, more than the whole limit on ${on}` +
        `${ask.batch && cap * BATCH_SHARE < amount && amount <= cap ? ` (a batch token may use ${Math.round(BATCH_SHARE * 100)}% of it)` : ''}: ${show(cap)}.` +
        (unit === 'tokens' || unit === 'money'
          ? ' It counts the prompt and max_tokens (or the model’s whole context when max_tokens is absent): send a lower max_tokens.'
          : '');
    } else {
      const used = this.usedEstimate(b);
      const away =
        b.leaseFailedUntil > 0
          ? ' (this server cannot reach its database just now: it spends only the share of the budget it already held)'
          : '';
      const batch =
        ask.batch && used + amount <= cap
          ? ' A batch token may use 90% of a budget; the rest is kept for interactive callers.'
          : '';
      message = quota
        ? `You exceeded the budget on ${on}: limit ${show(cap)}, used ${show(used)}, this request may use up to ${show(amount)}${away}. It resets in ${openAiDuration(resetMs)}; an admin can raise it (setLimit).${batch}`
        : `Rate limit reached on ${on}: limit ${show(cap)}, used ${show(used)}, requested ${show(amount)}${away}. Please try again in ${openAiDuration(resetMs)}.${batch}`;
    }
    const headers = this.headersFor([b], now);
    return {
      status: 429,
      type: quota ? 'insufficient_quota' : 'rate_limit_exceeded',
      code: quota ? 'insufficient_quota' : 'rate_limit_exceeded',
      message,
      retryAfterMs: resetMs,
      retryUseless,
      headers,
    };
  }

  /** OpenAI's headers for the tightest request limit and the tightest token limit among these buckets. */
  private headersFor(buckets: Bucket[], now: number): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [unit, suffix] of [
      ['requests', 'requests'],
      ['tokens', 'tokens'],
    ] as const) {
      let best: { limit: number; remaining: number; reset: number } | undefined;
      for (const b of buckets) {
        if (UNIT[b.kind] !== unit) continue;
        const limit = b.rule.values[b.kind] ?? 0;
        const remaining = Math.max(0, limit - this.usedEstimate(b));
        if (!best || remaining < best.remaining) best = { limit, remaining, reset: b.window.end - now };
      }
      if (!best) continue;
      out[`x-ratelimit-limit-${suffix}`] = String(best.limit);
      out[`x-ratelimit-remaining-${suffix}`] = String(best.remaining);
      out[`x-ratelimit-reset-${suffix}`] = openAiDuration(best.reset);
    }
    return out;
  }

  /**
   * Reports what was spent, and gives back what an idle bucket (or one whose window ended) holds unused. `all`:
   * everything, as at stop. A failed report (the database away) is kept and tried again on the next tick.
   */
  flush(all: boolean): Promise<void> {
    this.flushing ??= (async () => {
      const now = this.deps.nowMs();
      const work: Promise<void>[] = [];
      for (const [key, b] of this.buckets) {
        const ended = b.window.end <= now;
        const idle = all || ended || now - b.lastActive >= IDLE_MS;
        const spent = b.spent;
        const giveBack = idle ? Math.max(0, b.held - b.spent - b.reserved) : 0;
        if (spent === 0 && giveBack === 0) {
          if (ended && b.reserved === 0 && b.held === 0) this.buckets.delete(key);
          continue;
        }
        const release = Math.min(b.held, spent) + giveBack;
        b.spent -= spent;
        b.held -= release;
        work.push(
          this.deps.ledger.settle(b.key, spent, release).then(
            (seen) => {
              b.seenUsed = seen.used;
              b.seenLeased = seen.leased;
            },
            (err: unknown) => {
              // Kept, to be reported once the database is back: nothing spent is forgotten.
              b.spent += spent;
              b.held += release;
              if (!isDatabaseUnreachable(err)) this.deps.log.error('limits: could not settle a slice', { error: err });
            },
          ),
        );
      }
      await Promise.all(work);
      if (now - this.lastPrune > 3_600_000) {
        this.lastPrune = now;
        await this.deps.ledger.prune(now).catch(() => {});
      }
    })().finally(() => {
      this.flushing = undefined;
    });
    return this.flushing;
  }
}

function bucketKey(rule: LimitRule, kind: LimitKind, window: Window): string {
  return `${rule.id}|${kind}|${window.start}`;
}

/** The worst case a request may use: its prompt's upper bound and what it may generate, in tokens. */
type Worst = { prompt: number; completion: number; total: number };

/**
 * An upper bound on the prompt's tokens: llama.cpp's and vLLM's tokenizers make no token of less than one byte
 * of text, so the UTF-8 bytes bound the text; a chat template adds a few tokens per message and some around the
 * whole. A template that adds more than TEMPLATE_* is the one way a prompt passes its bound (docs/architecture.md).
 */
export function promptBound(body: Record<string, unknown>): { tokens: number; messages: number } {
  let bytes = 0;
  let ids = 0;
  const walk = (v: unknown): void => {
    if (typeof v === 'string') bytes += Buffer.byteLength(v);
    else if (typeof v === 'number') ids++;
    else if (Array.isArray(v)) for (const item of v) walk(item);
    else if (v && typeof v === 'object')
      for (const [k, inner] of Object.entries(v)) if (k !== 'role' && k !== 'type') walk(inner);
  };
  const messages = Array.isArray(body.messages) ? body.messages.length : 0;
  walk(body.messages);
  walk(body.prompt);
  walk(body.input);
  walk(body.tools);
  return { tokens: bytes + ids + messages * TEMPLATE_PER_MESSAGE + TEMPLATE_FIXED, messages };
}

export function worstCase(ask: Pick<LimitAsk, 'body' | 'contextSize' | 'embeddings'>): Worst {
  const context = ask.contextSize ?? DEFAULT_CONTEXT;
  const prompt = promptBound(ask.body).tokens;
  if (ask.embeddings) return { prompt, completion: 0, total: prompt };
  const n = typeof ask.body.n === 'number' && ask.body.n >= 1 ? Math.floor(ask.body.n) : 1;
  const max = [ask.body.max_completion_tokens, ask.body.max_tokens].find((v) => typeof v === 'number' && v >= 0) as
    | number
    | undefined;
  // Prompt and completion together never pass the context (the engine stops there), so the context bounds both.
  if (max === undefined) return { prompt: Math.min(prompt, context), completion: context * n, total: context * n };
  const completion = max * n;
  return { prompt, completion, total: Math.min(prompt + completion, context * n) };
}

function amountOf(kind: LimitKind, worst: Worst, price: { prompt: number; completion: number } | undefined): number {
  switch (UNIT[kind]) {
    case 'requests':
    case 'slots':
      return 1;
    case 'tokens':
      return worst.total;
    case 'money':
      // Tokens times the price of a million tokens is the price in millionths: exact, in integers (rounded up).
      return price ? Math.ceil(worst.prompt * price.prompt + worst.completion * price.completion) : 0;
  }
}

function usedOf(kind: LimitKind, usage: Settled, price: { prompt: number; completion: number } | undefined): number {
  switch (UNIT[kind]) {
    case 'requests':
      return 1;
    case 'slots':
      return 0;
    case 'tokens':
      return (usage?.promptTokens ?? 0) + (usage?.completionTokens ?? 0);
    case 'money':
      return price && usage
        ? Math.ceil(usage.promptTokens * price.prompt + usage.completionTokens * price.completion)
        : 0;
  }
}
