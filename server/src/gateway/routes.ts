import type { Logger } from '@hangar/common/log';
import { type Mode, modeOf } from '../catalog/catalog.service.js';
import { routingModels } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { routingReplicas } from '../fleet/fleet-store.js';
import type { RoutingPolicy } from '../generated/prisma/enums.js';

// What the gateway routes by: every catalog model with its adapters and its running replicas, read from
// PostgreSQL as one snapshot and refreshed every second. A request looks its name up here, in memory, so the
// hot path makes no database round-trip; and every server replica reads the same rows, so they agree without
// talking to each other. A model, an adapter or a replica that appears is routable within a refresh: publishing
// an adapter needs no restart.

export type RouteReplica = {
  id: string;
  modelId: string;
  state: 'PENDING' | 'LOADING' | 'READY';
  nodeName: string | null;
  /** The replica's OpenAI base URL (…/v1) and the engine key it accepts; both null until its agent reported. */
  endpoint: string | null;
  engineKey: string | null;
  adapters: ReadonlySet<string>;
  message: string | null;
};

export type RouteAdapter = { name: string; owner: string | null };

export type RouteModel = {
  id: string;
  name: string;
  mode: Mode;
  owner: string | null;
  idleSeconds: number;
  awakeUntil: Date | null;
  createdAt: Date;
  adapters: Map<string, RouteAdapter>;
  replicas: RouteReplica[];
  /** The last thing the fleet said of a replica of it that failed lately: why nothing serves it, if nothing does. */
  failed: string | null;
  /** Its context in tokens, when set: what a request without max_tokens may use at most (governance/limits). */
  contextSize?: number | null;
  /** How a replica is picked for it (affinity.ts). */
  routing: RoutingPolicy;
  /** Models that answer in its place when it cannot, in order (fallbacks.ts). */
  fallbacks: readonly string[];
};

/** A name as a caller sends it: a model, or an adapter and the model it runs on. */
export type Target = { model: RouteModel; adapter?: RouteAdapter };

export class RouteTable {
  private byName = new Map<string, Target>();
  private list: RouteModel[] = [];
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | undefined;
  private next: Promise<void> | undefined;
  private lastError: string | undefined;

  private readonly db: Db;
  private readonly log: Logger;
  private readonly everyMs: number;

  /** `everyMs`: how often the snapshot is read again (1 s: a new model or replica is routable within it). */
  constructor(deps: { db: Db; log: Logger; everyMs?: number }) {
    this.db = deps.db;
    this.log = deps.log;
    this.everyMs = deps.everyMs ?? 1000;
  }

  start(): Promise<void> {
    this.timer = setInterval(() => void this.refresh(), this.everyMs);
    this.timer.unref();
    return this.refresh();
  }

  stop() {
    clearInterval(this.timer);
  }

  /** A model or adapter by the name requests use; undefined for a name the catalog does not have. */
  lookup(name: string): Target | undefined {
    return this.byName.get(name);
  }

  models(): readonly RouteModel[] {
    return this.list;
  }

  /**
   * Reads the catalog again now; overlapping calls share one read. Never throws: the last snapshot stays. A call
   * made while a read is under way gets the next one, which starts after it: the one under way may have begun
   * before the caller's own write (a wake's placement), and would not hold it.
   */
  refresh(): Promise<void> {
    if (this.refreshing) {
      this.next ??= this.refreshing.then(() => {
        this.next = undefined;
        return this.refresh();
      });
      return this.next;
    }
    // On the loops' connections: under a flood of requests the table must still learn of new replicas.
    this.refreshing ??= this.load()
      .catch((err: unknown) => {
        const message = (err as Error).message;
        if (message !== this.lastError) {
          this.log.warn('gateway: could not read the catalog; routing by the last snapshot', { error: message });
        }
        this.lastError = message;
      })
      .finally(() => {
        this.refreshing = undefined;
      });
    return this.refreshing;
  }

  private async load() {
    const since = new Date(Date.now() - 10 * 60_000);
    // From their owners: the catalog's models and adapters, the fleet's replicas with their nodes and keys.
    const [models, replicas] = await Promise.all([routingModels(this.db.loops), routingReplicas(this.db.loops, since)]);
    const replicasOf = new Map<string, typeof replicas>();
    for (const r of replicas) replicasOf.set(r.modelId, [...(replicasOf.get(r.modelId) ?? []), r]);
    const rows = models.map((m) => ({ ...m, replicas: replicasOf.get(m.id) ?? [] }));
    const byName = new Map<string, Target>();
    const list: RouteModel[] = [];
    for (const m of rows) {
      const model: RouteModel = {
        id: m.id,
        name: m.name,
        mode: modeOf(m),
        owner: m.owner,
        idleSeconds: m.idleSeconds,
        awakeUntil: m.awakeUntil,
        createdAt: m.createdAt,
        adapters: new Map(m.adapters.map((a) => [a.name, { name: a.name, owner: a.owner }])),
        replicas: m.replicas
          .filter((r) => r.state !== 'FAILED')
          .map((r) => ({
            id: r.id,
            modelId: m.id,
            state: r.state as RouteReplica['state'],
            nodeName: r.node?.name ?? null,
            endpoint: r.endpoint,
            engineKey: r.engineKey?.key ?? null,
            adapters: new Set(r.adapters),
            message: r.message,
          })),
        failed: m.replicas.find((r) => r.state === 'FAILED')?.message ?? null,
        contextSize: m.contextSize,
        routing: m.routing,
        fallbacks: m.fallbacks ?? [],
      };
      list.push(model);
      byName.set(model.name, { model });
    }
    // Adapters after every model: where a model and an adapter share a name (rows written before the namespace
    // was made one, catalog/served-names.ts), the name is the adapter's, as the served_names migration decided.
    // Row order must not decide it, or a model served under a team adapter's name would answer the team.
    for (const model of list)
      for (const adapter of model.adapters.values()) byName.set(adapter.name, { model, adapter });
    this.byName = byName;
    this.list = list;
    if (this.lastError) this.log.info('gateway: reads the catalog again');
    this.lastError = undefined;
  }
}
