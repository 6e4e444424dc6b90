import type { Logger } from '@hangar/common/log';
import { type Mode, modeOf } from '../catalog/catalog.service.js';
import { routingModels } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import { routingReplicas } from '../fleet/fleet-store.js';
import type { RoutingPolicy } from '../generated/prisma/enums.js';
import type { PubSub } from '../pubsub.js';

// What the gateway routes by: every catalog model with its adapters and its running replicas, held in memory so a
// request looks its name up without a database round-trip. Every server replica reads the same rows, so they agree
// without talking to each other. It follows the catalog's events rather than reading it over and over: the
// database's triggers announce every change to a model, a replica or an adapter (catalog/model-events.ts), and
// the models named are read again, a few milliseconds' worth of events together, so a model, an adapter or a
// replica that appears is routable as soon as its event is heard, and a busy catalog of a thousand models costs
// nothing while nothing changes. The whole catalog is read at start, every HANGAR_GATEWAY_ROUTES_REREAD_SECONDS
// as a safety net, after the events' connection was lost and is back (what was said meanwhile went unheard), and
// every second while it is down.

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

/** The database's events, as the gateway hears them (pubsub.ts): without them the table reads the catalog every second. */
export type RouteEvents = {
  pubsub: PubSub;
  /** Since when this process has heard the events unbroken; undefined while it does not. */
  listeningSince: () => number | undefined;
};

/** Events heard within this long of the first are read together: a placement pass touches many replicas at once. */
const COALESCE_MS = 5;
/** More models changed than this at once (a declared catalog applied) are read with the whole catalog. */
const MAX_MODELS_PER_READ = 200;
/** How often the table looks whether its events still come (and, while they do not, reads the catalog). */
const TICK_MS = 1000;
/** A replica that failed within this long says why nothing serves its model (answers.ts whyNotReady). */
const FAILED_FOR_MS = 10 * 60_000;

type ModelRow = Awaited<ReturnType<typeof routingModels>>[number];
type ReplicaRow = Awaited<ReturnType<typeof routingReplicas>>[number];

export class RouteTable {
  private byName = new Map<string, Target>();
  private byId = new Map<string, RouteModel>();
  private list: RouteModel[] = [];
  private timer: NodeJS.Timeout | undefined;
  private coalesce: NodeJS.Timeout | undefined;
  private stopHearing: (() => void) | undefined;
  private lastError: string | undefined;
  /** What is to be read next: the whole catalog, and the models whose events came. */
  private wantAll = false;
  private readonly wantIds = new Set<string>();
  /** Reads asked for so far, and those the reads under way cover; a read asked for during one waits for the next. */
  private asked = 0;
  private reading = false;
  private readonly waiting: { upTo: number; resolve: () => void }[] = [];
  /** The events' connection as last seen, and when the whole catalog was last read. */
  private heardSince: number | undefined;
  private readAllAt = 0;

  private readonly db: Db;
  private readonly log: Logger;
  private readonly events: RouteEvents | undefined;
  private readonly rereadMs: number;

  /**
   * `rereadMs`: how often the whole catalog is read again while events come (HANGAR_GATEWAY_ROUTES_REREAD_SECONDS);
   * without `events`, every second.
   */
  constructor(deps: { db: Db; log: Logger; events?: RouteEvents; rereadMs?: number }) {
    this.db = deps.db;
    this.log = deps.log;
    this.events = deps.events;
    this.rereadMs = deps.events ? (deps.rereadMs ?? 60_000) : TICK_MS;
  }

  start(): Promise<void> {
    this.stop();
    if (this.events) this.hear(this.events);
    this.heardSince = this.events?.listeningSince();
    this.timer = setInterval(() => this.tick(), Math.min(TICK_MS, this.rereadMs));
    this.timer.unref();
    return this.refresh();
  }

  stop() {
    clearInterval(this.timer);
    clearTimeout(this.coalesce);
    this.coalesce = undefined;
    this.stopHearing?.();
    this.stopHearing = undefined;
  }

  /** A model or adapter by the name requests use; undefined for a name the catalog does not have. */
  lookup(name: string): Target | undefined {
    return this.byName.get(name);
  }

  models(): readonly RouteModel[] {
    return this.list;
  }

  /**
   * Reads the whole catalog again now; overlapping calls share one read. Never throws: the last snapshot stays. A
   * call made while a read is under way gets the next one, which starts after it: the one under way may have begun
   * before the caller's own write (a wake's placement), and would not hold it.
   */
  refresh(): Promise<void> {
    this.wantAll = true;
    return this.read();
  }

  /** Reads these models again (their event came), or the whole catalog with them when one is under way. */
  refreshModels(ids: Iterable<string>): Promise<void> {
    for (const id of ids) this.wantIds.add(id);
    return this.read();
  }

  private hear(events: RouteEvents) {
    const heard = events.pubsub.subscribe('model')[Symbol.asyncIterator]();
    let stopped = false;
    this.stopHearing = () => {
      stopped = true;
      void heard.return?.();
    };
    void (async () => {
      for (;;) {
        const next = await heard.next();
        if (next.done || stopped) return;
        this.wantIds.add(next.value);
        // The first event of a burst starts the clock; those within COALESCE_MS go with it in one read.
        this.coalesce ??= setTimeout(() => {
          this.coalesce = undefined;
          void this.read();
        }, COALESCE_MS);
      }
    })();
  }

  /** Once a second: is the catalog to be read whole (its events unheard now, back after a break, or due)? */
  private tick() {
    const since = this.events?.listeningSince();
    const due =
      !this.events ||
      since === undefined ||
      since !== this.heardSince ||
      performance.now() - this.readAllAt >= this.rereadMs;
    this.heardSince = since;
    if (due) void this.refresh();
  }

  private read(): Promise<void> {
    const upTo = ++this.asked;
    const done = new Promise<void>((resolve) => this.waiting.push({ upTo, resolve }));
    // Set before the loop starts: with nothing to read it ends at once, synchronously, and clears it itself.
    if (!this.reading) {
      this.reading = true;
      void this.readUntilDone();
    }
    return done;
  }

  /** Reads until nothing more is asked for; each caller is answered by the first read that began after its call. */
  private async readUntilDone() {
    while (this.wantAll || this.wantIds.size) {
      const upTo = this.asked;
      const all = this.wantAll || this.wantIds.size > MAX_MODELS_PER_READ;
      const ids = all ? [] : [...this.wantIds];
      this.wantAll = false;
      this.wantIds.clear();
      try {
        if (all) await this.loadAll();
        else await this.loadSome(ids);
        if (this.lastError) this.log.info('gateway: reads the catalog again');
        this.lastError = undefined;
      } catch (err) {
        const message = (err as Error).message;
        if (message !== this.lastError) {
          this.log.warn('gateway: could not read the catalog; routing by the last snapshot', { error: message });
        }
        this.lastError = message;
        // What was not read is read whole at the next tick (or the next event): none of it is lost.
        if (!all) for (const id of ids) this.wantIds.add(id);
        this.readAllAt = 0;
        break;
      }
      this.answer(upTo);
    }
    // Nothing more to read (or the database did not answer: the last snapshot stays, as refresh() promises): every
    // caller still waiting has what there is.
    this.answer(this.asked);
    this.reading = false;
  }

  private answer(upTo: number) {
    for (let i = this.waiting.length - 1; i >= 0; i--) {
      const w = this.waiting[i] as (typeof this.waiting)[number];
      if (w.upTo > upTo) continue;
      this.waiting.splice(i, 1);
      w.resolve();
    }
  }

  private async loadAll() {
    const startedAt = performance.now();
    const since = new Date(Date.now() - FAILED_FOR_MS);
    // From their owners: the catalog's models and adapters, the fleet's replicas with their nodes and keys.
    const [models, replicas] = await Promise.all([routingModels(this.db.loops), routingReplicas(this.db.loops, since)]);
    const byId = new Map<string, RouteModel>();
    const replicasOf = groupByModel(replicas);
    for (const m of models) byId.set(m.id, routeModel(m, replicasOf.get(m.id) ?? []));
    this.readAllAt = startedAt;
    this.install(byId);
  }

  private async loadSome(ids: string[]) {
    const since = new Date(Date.now() - FAILED_FOR_MS);
    const [models, replicas] = await Promise.all([
      routingModels(this.db.loops, ids),
      routingReplicas(this.db.loops, since, ids),
    ]);
    // A copy: a request under way keeps the table it began with. A model read again keeps its place (GET
    // /v1/models lists in this order); a new one comes last; one named by an event and not read was removed.
    const byId = new Map(this.byId);
    const replicasOf = groupByModel(replicas);
    const read = new Set<string>();
    for (const m of models) {
      byId.set(m.id, routeModel(m, replicasOf.get(m.id) ?? []));
      read.add(m.id);
    }
    for (const id of ids) if (!read.has(id)) byId.delete(id);
    this.install(byId);
  }

  /** Makes `byId` the table: the list and the names built once here, not per request. */
  private install(byId: Map<string, RouteModel>) {
    const byName = new Map<string, Target>();
    const list = [...byId.values()];
    for (const model of list) byName.set(model.name, { model });
    // Adapters after every model: where a model and an adapter share a name (rows written before the namespace
    // was made one, catalog/served-names.ts), the name is the adapter's, as the served_names migration decided.
    // Row order must not decide it, or a model served under a team adapter's name would answer the team.
    for (const model of list)
      for (const adapter of model.adapters.values()) byName.set(adapter.name, { model, adapter });
    this.byId = byId;
    this.byName = byName;
    this.list = list;
  }
}

function groupByModel(replicas: ReplicaRow[]): Map<string, ReplicaRow[]> {
  const of = new Map<string, ReplicaRow[]>();
  for (const r of replicas) {
    const list = of.get(r.modelId);
    if (list) list.push(r);
    else of.set(r.modelId, [r]);
  }
  return of;
}

/** A replica as the gateway routes to it (the shape other modules extend with what they need of a replica). */
export function routeReplica(r: ReplicaRow): RouteReplica {
  return {
    id: r.id,
    modelId: r.modelId,
    state: r.state as RouteReplica['state'],
    nodeName: r.node?.name ?? null,
    endpoint: r.endpoint,
    engineKey: r.engineKey?.key ?? null,
    adapters: new Set(r.adapters),
    message: r.message,
  };
}

function routeModel(m: ModelRow, replicas: ReplicaRow[]): RouteModel {
  return {
    id: m.id,
    name: m.name,
    mode: modeOf(m),
    owner: m.owner,
    idleSeconds: m.idleSeconds,
    awakeUntil: m.awakeUntil,
    createdAt: m.createdAt,
    adapters: new Map(m.adapters.map((a) => [a.name, { name: a.name, owner: a.owner }])),
    replicas: replicas.filter((r) => r.state !== 'FAILED').map(routeReplica),
    failed: replicas.find((r) => r.state === 'FAILED')?.message ?? null,
    contextSize: m.contextSize,
    routing: m.routing,
    fallbacks: m.fallbacks ?? [],
  };
}
