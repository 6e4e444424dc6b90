import type { Logger } from '@hangar/common/log';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import { systemActor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import type { CatalogService } from '../catalog/catalog.service.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { gpuTimeBetween } from '../fleet/gpu-time.js';
import type { UsageService } from '../gateway/usage.service.js';
import { type Price, Prisma } from '../generated/prisma/client.js';
import type { PriceTarget } from '../generated/prisma/enums.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import type { OrgService } from '../org/org.service.js';
import type { OwnerRef } from '../org/org-owners.js';
import type { PubSub } from '../pubsub.js';
import { loadDeclaredPrices, type PriceInput, writePrice } from './cost-prices.js';
import { type CostRow, readCostRows } from './cost-query.js';
import { type PriceTable, PricingCache, type TokenPrice } from './pricing.js';

const Decimal = Prisma.Decimal;
type Decimal = Prisma.Decimal;

const MINUTE_MS = 60_000;
const HOUR_MS = 60 * MINUTE_MS;
const DAY_MS = 24 * HOUR_MS;
/** The longest range one report reads: a quarter, so "last month" and "this quarter" are one question each. */
export const COST_MAX_DAYS = 92;
/** Points on a report's chart, at most. */
export const COST_MAX_POINTS = 2000;

/** What a report's lines are grouped by. TEAM is each team the caller belongs to (a caller in two counts in both). */
export type CostDimension = 'SCOPE' | 'TEAM' | 'MODEL' | 'NODE';

export type CostFigures = {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** GPU-hours attributed to the calls (or, on an idle line, held with no calls). */
  gpuHours: Decimal;
  /** What the calls cost. */
  cost: Decimal;
  /** What the replicas cost while they served nobody: the price of keeping the model ready. */
  idleCost: Decimal;
};

export type CostLine = CostFigures & {
  /** Idle GPU time alone: a line of its own when grouped by SCOPE or TEAM (it is no caller's). */
  idle: boolean;
  /** "key:<token id>" or "user:<user id>" (a console session); null on an idle line or when not grouped by it. */
  scope: string | null;
  scopeLabel: string | null;
  team: string | null;
  model: string | null;
  node: string | null;
};

export type CostPoint = { at: Date; cost: Decimal; idleCost: Decimal };

export type CostReport = {
  from: Date;
  to: Date;
  stepMinutes: number;
  currency: string;
  by: CostDimension[];
  lines: CostLine[];
  points: CostPoint[];
  total: CostFigures;
  /** GPU-hours held on nodes with no price (neither the node's nor its GPU model's): they cost nothing here. */
  unpricedGpuHours: Decimal;
};

export type CostInput = {
  from: Date;
  to: Date;
  by?: readonly CostDimension[] | null;
  /** Only the calls of the callers this owner admits: team:<org/team>, user:<email>, key:<id>, … */
  scope?: string | null;
  model?: string | null;
  /** An adapter's name; "" is the base model alone. */
  adapter?: string | null;
  /** A replica's id: the calls it served alone. */
  replica?: string | null;
  /** An API token's id; "" is console sessions. */
  token?: string | null;
  /** Minutes per point; by default an hour up to 4 days, a day beyond. */
  step?: number | null;
};

export type CostDeps = {
  db: Db;
  audit: AuditService;
  config: Config;
  log: Logger;
  usage: UsageService;
  catalog: CatalogService;
  org: OrgService;
};

const zero = () => ({
  requests: 0,
  promptTokens: 0,
  completionTokens: 0,
  gpuHours: new Decimal(0),
  cost: new Decimal(0),
  idleCost: new Decimal(0),
});

function addInto(into: CostFigures, more: CostFigures) {
  into.requests += more.requests;
  into.promptTokens += more.promptTokens;
  into.completionTokens += more.completionTokens;
  into.gpuHours = into.gpuHours.plus(more.gpuHours);
  into.cost = into.cost.plus(more.cost);
  into.idleCost = into.idleCost.plus(more.idleCost);
}

/** Cents, half up: what a report shows and what its test checks to the cent. */
export const cents = (d: Decimal) => d.toDecimalPlaces(2, Decimal.ROUND_HALF_UP).toFixed(2);

/** Cost and idle cost per million tokens; null with no tokens. */
export function perMillionTokens(f: CostFigures): Decimal | null {
  const tokens = f.promptTokens + f.completionTokens;
  return tokens > 0 ? f.cost.plus(f.idleCost).times(1_000_000).dividedBy(tokens) : null;
}

/**
 * Prices and what calls cost (cost-query.ts says how). An operator's prices are ADMIN's to set; a report reads the
 * usage rows the viewer may read (the gateway's rule), and idle time only when it is a report of the whole fleet.
 */
export class CostService {
  readonly pricing: PricingCache;
  private readonly deps: CostDeps;

  constructor(deps: CostDeps) {
    this.deps = deps;
    this.pricing = new PricingCache({ currency: deps.config.currency, load: () => this.priceTable(), log: deps.log });
  }

  get currency(): string {
    return this.deps.config.currency;
  }

  /** Reads hangar.yaml's prices, then keeps the price table of pricing.ts fresh from the `pricing` event. */
  async start(pubsub: PubSub): Promise<void> {
    await loadDeclaredPrices(this.deps.db, this.deps.config.configFile);
    await this.pricing.start(pubsub.subscribe('pricing'));
  }

  stop(): void {
    this.pricing.stop();
  }

  prices(target?: PriceTarget | null): Promise<Price[]> {
    return this.deps.db.price.findMany({
      where: target ? { target } : {},
      orderBy: [{ target: 'asc' }, { name: 'asc' }],
    });
  }

  setPrice(actor: Actor, input: PriceInput, action: string): Promise<Result<Price | null>> {
    return writePrice(this.deps, actor, input, action);
  }

  async report(viewer: Viewer, input: CostInput, owners?: string[]): Promise<Result<CostReport>> {
    const range = checkRange(input);
    if (!range.ok) return range;
    const { from, to, stepMs } = range.value;
    // Calls are priced minute by minute: a range whose minutes were pruned (HANGAR_USAGE_RETENTION) is refused.
    const kept = this.deps.usage.minutesKept(from);
    if (!kept.ok) return kept;
    const by = [...new Set(input.by ?? [])];
    let only: OwnerRef | undefined;
    if (input.scope != null) {
      const found = await this.deps.org.resolveOwner(input.scope, { field: 'scope' });
      if (!found.ok) return found;
      only = { scope: found.value.scope, id: found.value.id };
    }
    const models = await this.deps.catalog.list();
    const nameOf = new Map(models.map((m) => [m.id, m.name]));
    const idOf = new Map(models.map((m) => [m.name, m.id]));
    const tokenPriced = (await this.prices('MODEL'))
      .filter((p) => p.perMillionPromptTokens !== null || p.perMillionCompletionTokens !== null)
      .flatMap((p) => idOf.get(p.name) ?? []);
    const rows = await readCostRows(this.deps.db, {
      fromMs: from.getTime(),
      toMs: to.getTime(),
      stepMs,
      usage: this.deps.usage.rowsForCost(
        viewer,
        {
          from,
          to,
          model: input.model,
          adapter: input.adapter,
          replica: input.replica,
          token: input.token,
        },
        owners,
      ),
      gpuTime: gpuTimeBetween(
        from,
        to,
        input.model != null ? [idOf.get(input.model) ?? ''] : owners ? visibleModelIds(models, owners) : undefined,
      ),
      tokenPricedModelIds: tokenPriced,
      // Idle time is nobody's calls: in a report of the fleet, not of some callers (nor of a viewer's own).
      idle:
        only === undefined &&
        input.token == null &&
        input.adapter == null &&
        input.replica == null &&
        viewerReadsAll(viewer),
    });
    return ok(await this.shape(rows, { from, to, stepMs, by, only, nameOf }));
  }

  /** What the calls `usage(...)` counts cost: the same rows, in one more query for the whole range. */
  async callsCost(
    viewer: Viewer,
    filter: Pick<CostInput, 'from' | 'to' | 'model' | 'adapter' | 'replica' | 'token'>,
    owners?: string[],
  ): Promise<Result<Decimal>> {
    const { from, to, model, adapter, replica, token } = filter;
    const report = await this.report(viewer, { from, to, model, adapter, replica, token }, owners);
    return report.ok ? ok(report.value.total.cost) : report;
  }

  /** Turns the query's rows into lines grouped by `by`, points per step, and totals. */
  private async shape(
    rows: CostRow[],
    q: {
      from: Date;
      to: Date;
      stepMs: number;
      by: CostDimension[];
      only: OwnerRef | undefined;
      nameOf: Map<string, string>;
    },
  ): Promise<CostReport> {
    const callerKey = (r: CostRow) => (r.tokenId ? `key:${r.tokenId}` : r.userId ? `user:${r.userId}` : null);
    // Whom each caller stands for (its teams, for TEAM and for a scope filter): one read per distinct caller.
    const needReach = q.only !== undefined || q.by.includes('TEAM');
    const reach = new Map<string, Awaited<ReturnType<OrgService['callerReach']>>>();
    if (needReach) {
      const callers = new Map<string, { userId: string; tokenId?: string }>();
      for (const r of rows) {
        const k = callerKey(r);
        if (k && r.userId) callers.set(k, { userId: r.userId, tokenId: r.tokenId || undefined });
      }
      await Promise.all([...callers].map(async ([k, c]) => reach.set(k, await this.deps.org.callerReach(c))));
    }
    const admitted = (r: CostRow) => {
      const only = q.only;
      if (!only) return true;
      const k = callerKey(r);
      if (!k) return false;
      if (only.scope === 'key') return r.tokenId === only.id;
      if (only.scope === 'user') return r.userId === only.id;
      return reach.get(k)?.[only.scope].has(only.id) ?? false;
    };
    const lines = new Map<string, CostLine>();
    const total = zero();
    let unpriced = new Decimal(0);
    const count = Math.ceil((q.to.getTime() - q.from.getTime()) / q.stepMs);
    const points: CostPoint[] = Array.from({ length: count }, (_, i) => ({
      at: new Date(q.from.getTime() + i * q.stepMs),
      cost: new Decimal(0),
      idleCost: new Decimal(0),
    }));
    for (const r of rows) {
      if (r.kind === 'calls' && !admitted(r)) continue;
      const idle = r.kind === 'idle';
      const amount = new Decimal(r.cost);
      const figures: CostFigures = {
        requests: Number(r.requests),
        promptTokens: Number(r.promptTokens),
        completionTokens: Number(r.completionTokens),
        gpuHours: new Decimal(r.gpuHours),
        cost: idle ? new Decimal(0) : amount,
        idleCost: idle ? amount : new Decimal(0),
      };
      unpriced = unpriced.plus(r.unpricedGpuHours);
      addInto(total, figures);
      const point = points[r.bin];
      if (point) {
        if (idle) point.idleCost = point.idleCost.plus(amount);
        else point.cost = point.cost.plus(amount);
      }
      const model = idle ? (q.nameOf.get(r.modelId ?? '') ?? `deleted model ${r.modelId?.slice(0, 8)}`) : r.model;
      const scope = idle ? null : callerKey(r);
      const teams = q.by.includes('TEAM')
        ? idle
          ? [null]
          : [...(scope ? (reach.get(scope)?.team ?? []) : [])].map((t) => `team:${t}`)
        : [null];
      for (const team of teams.length ? teams : [null]) {
        const line: Omit<CostLine, keyof CostFigures> = {
          idle: idle && (q.by.includes('SCOPE') || q.by.includes('TEAM')),
          scope: q.by.includes('SCOPE') ? scope : null,
          scopeLabel: null,
          team: q.by.includes('TEAM') ? team : null,
          model: q.by.includes('MODEL') ? model : null,
          node: q.by.includes('NODE') ? r.node : null,
        };
        const key = JSON.stringify([line.idle, line.scope, line.team, line.model, line.node]);
        let at = lines.get(key);
        if (!at) {
          at = { ...line, ...zero() };
          lines.set(key, at);
        }
        addInto(at, figures);
      }
    }
    // Labels for people: "key:ci-deploy (alice@example.com)", "team:acme/research".
    const owners: OwnerRef[] = [];
    for (const l of lines.values()) {
      for (const k of [l.scope, l.team]) {
        const m = k ? /^(key|user|team):(.+)$/.exec(k) : null;
        if (m) owners.push({ scope: m[1] as OwnerRef['scope'], id: m[2] as string });
      }
    }
    const labels = owners.length ? await this.deps.org.formatOwners(owners) : new Map<string, string>();
    const out = [...lines.values()].map((l) => ({
      ...l,
      scopeLabel: l.scope ? (labels.get(l.scope) ?? l.scope) : null,
      team: l.team ? (labels.get(l.team) ?? l.team) : null,
    }));
    out.sort((a, b) => b.cost.plus(b.idleCost).comparedTo(a.cost.plus(a.idleCost)));
    return {
      from: q.from,
      to: q.to,
      stepMinutes: q.stepMs / MINUTE_MS,
      currency: this.currency,
      by: q.by,
      lines: out,
      points,
      total,
      unpricedGpuHours: unpriced,
    };
  }

  /**
   * The table pricing.ts answers from: each model's fixed price per million tokens, and for the others what a
   * million of their tokens cost over the last day on this fleet, idle time included (the same for prompt and
   * completion tokens: GPU time is divided by tokens, whichever kind).
   */
  private async priceTable(): Promise<PriceTable> {
    const perMillion = new Map<string, TokenPrice>();
    const to = new Date();
    const report = await this.report(systemActor('pricing').viewer, {
      from: new Date(to.getTime() - DAY_MS),
      to,
      by: ['MODEL'],
      step: 1440,
    });
    if (report.ok) {
      for (const l of report.value.lines) {
        const p = l.model ? perMillionTokens(l) : null;
        if (l.model && p) perMillion.set(l.model, { prompt: p.toNumber(), completion: p.toNumber() });
      }
    }
    for (const p of await this.prices('MODEL')) {
      if (p.perMillionPromptTokens === null && p.perMillionCompletionTokens === null) continue;
      perMillion.set(p.name, {
        prompt: p.perMillionPromptTokens?.toNumber() ?? 0,
        completion: p.perMillionCompletionTokens?.toNumber() ?? 0,
      });
    }
    return { currency: this.currency, perMillionTokens: perMillion };
  }
}

function viewerReadsAll(viewer: Viewer): boolean {
  return (
    viewer.kind === 'system' ||
    ((viewer.kind === 'user' || viewer.kind === 'token') && ['ADMIN', 'OPERATOR'].includes(viewer.role))
  );
}

/** The models whose owner the viewer's sight admits (null owner: everyone's). */
function visibleModelIds(models: { id: string; owner: string | null }[], owners: string[]): string[] {
  const seen = new Set(owners);
  return models.filter((m) => m.owner === null || seen.has(m.owner)).map((m) => m.id);
}

function checkRange(input: CostInput): Result<{ from: Date; to: Date; stepMs: number }> {
  const from = new Date(Math.floor(input.from.getTime() / MINUTE_MS) * MINUTE_MS);
  const to = new Date(Math.ceil(input.to.getTime() / MINUTE_MS) * MINUTE_MS);
  if (!(input.to.getTime() > input.from.getTime())) {
    return fail(
      new ValidationError(
        'to',
        `to must be after from: ${input.to.toISOString()} is not after ${input.from.toISOString()}; swap them or move to later`,
      ),
    );
  }
  const span = to.getTime() - from.getTime();
  if (span > COST_MAX_DAYS * DAY_MS) {
    return fail(
      new ValidationError(
        'from',
        `from is ${(span / DAY_MS).toFixed(1)} days before to; at most ${COST_MAX_DAYS}: ask for a shorter range, or for several`,
      ),
    );
  }
  const stepMinutes = input.step ?? (span <= 4 * DAY_MS ? 60 : 1440);
  if (!Number.isInteger(stepMinutes) || stepMinutes < 1 || stepMinutes > 1440 * 31) {
    return fail(
      new ValidationError('step', `step is whole minutes from 1 to ${1440 * 31}: ${input.step} is not accepted`),
    );
  }
  const stepMs = stepMinutes * MINUTE_MS;
  if (Math.ceil(span / stepMs) > COST_MAX_POINTS) {
    return fail(
      new ValidationError(
        'step',
        `step ${stepMinutes} gives ${Math.ceil(span / stepMs)} points; at most ${COST_MAX_POINTS}: ask for a longer step`,
      ),
    );
  }
  return ok({ from, to, stepMs });
}
