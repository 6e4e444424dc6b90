import { Counter, Gauge, type Registry } from 'prom-client';
import type { UsageEvent } from '../gateway/usage.js';
import type { PricingCache } from './pricing.js';

// /metrics for cost: what a million tokens of each model costs on this fleet now (its fixed price, or its GPU time
// over the tokens it served in the last day, idle included: pricing.ts), by model and token kind. Models are labels
// only up to MAX_MODELS, the most expensive first, so a catalog of thousands cannot blow up a Prometheus.

const MAX_MODELS = 100;

/** Counts what each answered call cost (spend.count), for hangar_cost_total. */
export type SpendMeter = { count(e: UsageEvent): void };

export function registerCostMetrics(registry: Registry, pricing: PricingCache): SpendMeter {
  new Gauge({
    name: 'hangar_cost_per_million_tokens',
    help: 'What a million tokens of a model cost on this fleet now, in the site currency (label currency): its fixed price, or its GPU time over the tokens it served in the last day, idle included',
    labelNames: ['model', 'kind', 'currency'],
    registers: [registry],
    // Every worker (HANGAR_WORKERS) holds the same prices: one's, not their sum.
    aggregator: 'first',
    collect() {
      this.reset();
      const currency = pricing.currency;
      const top = pricing
        .entries()
        .sort((a, b) => b[1].prompt + b[1].completion - (a[1].prompt + a[1].completion))
        .slice(0, MAX_MODELS);
      for (const [model, p] of top) {
        this.set({ model, kind: 'prompt', currency }, p.prompt);
        this.set({ model, kind: 'completion', currency }, p.completion);
      }
    },
  });
  // A running total of money spent per model, for a dashboard's rate() and alerts: each call's tokens at the
  // model's price now, counted as the gateway accounts the call (a Map lookup, no database). It is this process's
  // count since it started, as every Prometheus counter; the exact bill for a period is costReport's (GPU time
  // shared by tokens, with idle time apart), which this approximates with the price pricing.ts holds at the time.
  const spent = new Counter({
    name: 'hangar_cost_total',
    help: 'Money spent on calls answered by this process since it started, by model, in the site currency (label currency): each call priced at its tokens and the model price at the time (fixed, or measured over the last day); unpriced models count nothing',
    labelNames: ['model', 'currency'],
    registers: [registry],
  });
  const labelled = new Set<string>();
  return {
    count(e) {
      const price = pricing.perMillionTokens(e.model);
      if (!price || (e.promptTokens === 0 && e.completionTokens === 0)) return;
      const money = (e.promptTokens * price.prompt + e.completionTokens * price.completion) / 1_000_000;
      if (!(money > 0)) return;
      // Past MAX_MODELS distinct models, the rest add up under "other": the series stay bounded.
      if (!labelled.has(e.model) && labelled.size < MAX_MODELS) labelled.add(e.model);
      const model = labelled.has(e.model) ? e.model : 'other';
      spent.inc({ model, currency: pricing.currency }, money);
    },
  };
}
