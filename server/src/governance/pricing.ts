import { coalesced } from '@hangar/common/coalesce';
import type { Logger } from '@hangar/common/log';

// What a million tokens of a model costs, for whoever turns tokens into money on the request path (a spend
// budget, limits.ts): read from memory, never from the database per request. The table behind it is loaded once
// at start, again on every `pricing` event (a price set anywhere, in any server process, pubsub.ts) and every few
// minutes, because a measured price (GPU time over tokens served) moves with traffic even when nobody sets one.
// The instance: services.cost.pricing (cost.service.ts builds it, app.ts starts it before the first request).

/** Money per million tokens, in the site's currency (HANGAR_CURRENCY). */
export type TokenPrice = { prompt: number; completion: number };

export interface Pricing {
  /** The site's currency code (HANGAR_CURRENCY, "USD" by default). */
  readonly currency: string;
  /**
   * A million prompt and completion tokens of `model` (its served name): the operator's fixed price when one is
   * set, else what its replicas' GPU time cost per token served over the last day, idle time included; undefined
   * when neither is known (no price set anywhere, or no traffic yet), which a spend budget reads as free.
   */
  perMillionTokens(model: string): TokenPrice | undefined;
}

/** Everything the reader answers from, as cost.service.ts loads it. */
export type PriceTable = { currency: string; perMillionTokens: Map<string, TokenPrice> };

/** How often the table is read again without an event: measured prices drift with traffic. */
export const PRICING_REFRESH_MS = 5 * 60_000;

export class PricingCache implements Pricing {
  private table: PriceTable;
  private readonly load: () => Promise<PriceTable>;
  private readonly log: Logger | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(deps: { currency: string; load: () => Promise<PriceTable>; log?: Logger }) {
    this.table = { currency: deps.currency, perMillionTokens: new Map() };
    this.load = deps.load;
    this.log = deps.log;
  }

  get currency(): string {
    return this.table.currency;
  }

  perMillionTokens(model: string): TokenPrice | undefined {
    return this.table.perMillionTokens.get(model);
  }

  /** Every model priced now, by name: what /metrics shows (cost-metrics.ts). */
  entries(): [string, TokenPrice][] {
    return [...this.table.perMillionTokens];
  }

  /**
   * Reads the table again. Calls while a read is under way make one more read after it (a price set during a
   * read is not lost); a failed read keeps the last table (the database away: the last prices hold).
   */
  readonly refresh = coalesced(async () => {
    try {
      this.table = await this.load();
    } catch (err) {
      this.log?.warn('prices not read; the last ones stay in use', { err: String(err) });
      return false;
    }
  });

  /** Reads now, on every event, and every PRICING_REFRESH_MS until stop(). */
  async start(events?: AsyncIterable<unknown>): Promise<void> {
    await this.refresh();
    this.timer = setInterval(() => void this.refresh(), PRICING_REFRESH_MS);
    this.timer.unref();
    if (events)
      void (async () => {
        for await (const _ of events) void this.refresh();
      })().catch(() => {});
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
