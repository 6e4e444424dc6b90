import { Gauge, type Registry } from 'prom-client';
import type { LimitEnforcer } from './limits-enforcer.js';
import { MONEY_SCALE } from './limits-windows.js';

// /metrics for limits: what is left of each limit's current window and how many requests each refused, by scope
// and kind. Scopes are labels only up to MAX_SCOPES (limits are set by admins, so there are few; past that the
// rest are summed as "other"), so a site with thousands of per-key limits cannot blow up its Prometheus.

const MAX_SCOPES = 100;

export function registerLimitMetrics(registry: Registry, enforcer: LimitEnforcer): void {
  const label = (scopes: Map<string, string>, key: string, name: string) => {
    if (!scopes.has(key) && scopes.size >= MAX_SCOPES) return 'other';
    scopes.set(key, name);
    return name;
  };
  new Gauge({
    name: 'hangar_limit_remaining',
    help: 'What is left of each limit in its current window, as this process sees it (spend in currency units)',
    labelNames: ['scope', 'model', 'kind'],
    registers: [registry],
    // Across HANGAR_WORKERS, the worker that has seen the most of the budget spent: the least left.
    aggregator: 'min',
    collect() {
      this.reset();
      const scopes = new Map<string, string>();
      for (const r of enforcer.remaining()) {
        const scale = r.kind === 'spendPerMonth' ? MONEY_SCALE : 1;
        const labels = { scope: label(scopes, r.rule.scope, r.rule.label), model: r.rule.model || '*', kind: r.kind };
        if (labels.scope === 'other') continue;
        this.set(labels, r.remaining / scale);
      }
    },
  });
  new Gauge({
    name: 'hangar_limit_refusals',
    help: 'Requests refused by each limit since this process started (a counter that restarts with the process)',
    labelNames: ['scope', 'kind'],
    registers: [registry],
    collect() {
      this.reset();
      const scopes = new Map<string, string>();
      const sums = new Map<string, { scope: string; kind: string; n: number }>();
      for (const c of enforcer.refusalCounts()) {
        const scope = label(scopes, c.rule.scope, c.rule.label);
        const key = `${scope}\n${c.kind}`;
        const s = sums.get(key) ?? { scope, kind: c.kind, n: 0 };
        s.n += c.count;
        sums.set(key, s);
      }
      for (const s of sums.values()) this.set({ scope: s.scope, kind: s.kind }, s.n);
    },
  });
}
