import { Gauge, type Registry } from 'prom-client';
import type { PricingCache } from './pricing.js';

// /metrics for cost: what a million tokens of each model costs on this fleet now (its fixed price, or its GPU time
// over the tokens it served in the last day, idle included: pricing.ts), by model and token kind. Models are labels
// only up to MAX_MODELS, the most expensive first, so a catalog of thousands cannot blow up a Prometheus.

const MAX_MODELS = 100;

export function registerCostMetrics(registry: Registry, pricing: PricingCache): void {
  new Gauge({
    name: 'hangar_cost_per_million_tokens',
    help: 'What a million tokens of a model cost on this fleet now, in the site currency (label currency): its fixed price, or its GPU time over the tokens it served in the last day, idle included',
    labelNames: ['model', 'kind', 'currency'],
    registers: [registry],
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
}
