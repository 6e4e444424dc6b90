import cluster from 'node:cluster';
import type { Logger } from '@hangar/common/log';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { Db } from '../db/client.js';
import { nodeGpus } from '../fleet/node-inventory.js';
import type { UsageEvent } from '../gateway/usage.js';
import { answerScrapes } from './cluster-metrics.js';

// What Prometheus scrapes at /metrics (Prometheus' text format, through prom-client). Two kinds of figure:
// - what this process counts as it goes (gateway requests, tokens and latency; GraphQL's, through Yoga's
//   Prometheus plugin; the process itself): counters and histograms, so rate() and histogram_quantile() work;
// - what the database says the mirror, the fleet and the training jobs are now: gauges read at scrape time, in
//   one short burst of queries per scrape shared by every gauge (and by scrapes less than a second apart), so a
//   scrape costs the same whatever the number of series. Every replica of the server reports the same database
//   figures; sum the counters, not the gauges, across replicas.

/** The gateway latency buckets, in seconds: from a cached answer to a long generation. */
const LATENCY_BUCKETS_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** Why a mirror file failed, as a label: a handful of classes, never the message itself (unbounded series). */
export function failureClass(error: string | null): string {
  const e = (error ?? '').toLowerCase();
  if (/sha-?256|checksum|does not match/.test(e)) return 'verification';
  if (/\b(401|403)\b|unauthori[sz]ed|forbidden|token/.test(e)) return 'denied';
  if (/\b(404|410)\b|not found/.test(e)) return 'not_found';
  if (/enospc|no space|disk|quota/.test(e)) return 'disk';
  if (/econn|etimedout|enotfound|eai_again|socket|timed? ?out|unreachable|reset|\b5\d\d\b|429/.test(e)) {
    return 'upstream';
  }
  return 'other';
}

type Snapshot = {
  files: { state: string; count: number; bytesTotal: number; bytesDone: number; bytesPerSecond: number }[];
  failures: Map<string, number>;
  leases: number;
  retrying: number;
  nodes: { name: string; online: boolean; gpus: { index: number; totalMiB: number; freeMiB: number }[] }[];
  replicas: { state: string; count: number }[];
  trainJobs: { state: string; count: number }[];
  trainSteps: number;
};

export type MetricsDeps = {
  db: Db;
  log: Logger;
  /** The fleet's rule for whether a node is online (FleetService.isOnline). */
  isOnline: (node: { lastSeenAt: Date | null; leftAt: Date | null }) => boolean;
  /** Requests the gateway holds open now, in this process. */
  gatewayInFlight: () => number;
};

export class Metrics {
  readonly registry = new Registry();
  private readonly gatewayRequests: Counter<'model' | 'outcome'>;
  private readonly gatewayTokens: Counter<'model' | 'kind'>;
  private readonly gatewayDuration: Histogram<'model'>;
  private readonly gatewayFirstToken: Histogram<'model'>;
  private readonly subscriptionResults: Counter<'how'>;
  private readonly scalingDecisions: Counter<'model' | 'direction'>;
  private snapshot: { at: number; value: Promise<Snapshot | undefined> } | undefined;
  /** With HANGAR_WORKERS above 1: a scrape answers with every worker's figures (cluster-metrics.ts). */
  private readonly acrossWorkers = cluster.isWorker ? answerScrapes(this.registry) : undefined;

  constructor(private readonly deps: MetricsDeps) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: 'hangar_' });
    this.gatewayRequests = new Counter({
      name: 'hangar_gateway_requests_total',
      help: 'Requests the gateway sent to a model (or could not), by model and outcome (ok, error, aborted)',
      labelNames: ['model', 'outcome'],
      registers,
    });
    this.gatewayTokens = new Counter({
      name: 'hangar_gateway_tokens_total',
      help: 'Tokens the replicas reported in their usage, by model and kind (prompt, completion)',
      labelNames: ['model', 'kind'],
      registers,
    });
    this.gatewayDuration = new Histogram({
      name: 'hangar_gateway_request_duration_seconds',
      help: "From a request's arrival to its answer's last byte, by model",
      labelNames: ['model'],
      buckets: LATENCY_BUCKETS_S,
      registers,
    });
    this.subscriptionResults = new Counter({
      name: 'hangar_graphql_subscription_results_total',
      help: 'Subscription event results sent, by how they were made: executed for the subscriber, or shared from another subscriber with the same document, variables and caller',
      labelNames: ['how'],
      registers,
    });
    this.scalingDecisions = new Counter({
      name: 'hangar_scaling_decisions_total',
      help: 'Replicas the autoscaler added (direction="up") or drained and removed (direction="down"), by model; counted by the server that decided',
      labelNames: ['model', 'direction'],
      registers,
    });
    this.gatewayFirstToken = new Histogram({
      name: 'hangar_gateway_time_to_first_byte_seconds',
      help: "From a request's arrival to the replica's first byte of answer, by model",
      labelNames: ['model'],
      buckets: LATENCY_BUCKETS_S,
      registers,
    });
    new Gauge({
      name: 'hangar_gateway_in_flight_requests',
      help: 'Requests the gateway holds open now (this process)',
      registers,
      collect() {
        this.set(deps.gatewayInFlight());
      },
    });
    this.databaseGauges(registers);
  }

  /** Counts one gateway request; the gateway's usage recorder calls it for every request it accounts. */
  observeSubscriptionResult = (how: 'executed' | 'shared') => {
    this.subscriptionResults.inc({ how });
  };

  /** Counts one autoscaler decision (fleet/scaling-loop.ts). */
  observeScaling = (model: string, direction: 'up' | 'down') => {
    this.scalingDecisions.inc({ model, direction });
  };

  observeGateway = (e: UsageEvent) => {
    this.gatewayRequests.inc({ model: e.model, outcome: e.outcome });
    if (e.promptTokens) this.gatewayTokens.inc({ model: e.model, kind: 'prompt' }, e.promptTokens);
    if (e.completionTokens) this.gatewayTokens.inc({ model: e.model, kind: 'completion' }, e.completionTokens);
    this.gatewayDuration.observe({ model: e.model }, e.durationMs / 1000);
    if (e.ttftMs !== null) this.gatewayFirstToken.observe({ model: e.model }, e.ttftMs / 1000);
  };

  /** The exposition, as Prometheus asks for it. */
  async render(): Promise<{ contentType: string; body: string }> {
    const body = this.acrossWorkers ? await this.acrossWorkers.render() : await this.registry.metrics();
    return { contentType: this.registry.contentType, body };
  }

  private databaseGauges(registers: Registry[]) {
    // Each gauge asks for the same snapshot; the first one of a scrape reads it, the others wait for that read.
    const read = () => this.read();
    const gauge = <L extends string>(
      name: string,
      help: string,
      labelNames: L[],
      fill: (g: Gauge<L>, s: Snapshot) => void,
    ) =>
      new Gauge<L>({
        name,
        help,
        labelNames,
        registers,
        // Every worker (HANGAR_WORKERS) reads the same database: one's figures, not their sum.
        aggregator: 'first',
        async collect() {
          const s = await read();
          this.reset();
          if (s) fill(this, s);
        },
      });

    gauge('hangar_mirror_files', 'Mirror files by state', ['state'], (g, s) => {
      for (const f of s.files) g.set({ state: f.state }, f.count);
    });
    gauge(
      'hangar_mirror_bytes',
      'Bytes of mirror files by state (PRESENT: on disk and verified)',
      ['state'],
      (g, s) => {
        for (const f of s.files) g.set({ state: f.state }, f.state === 'PRESENT' ? f.bytesTotal : f.bytesDone);
      },
    );
    gauge('hangar_mirror_queue_depth', 'Mirror files waiting for a transfer slot (QUEUED)', [], (g, s) => {
      g.set(s.files.find((f) => f.state === 'QUEUED')?.count ?? 0);
    });
    gauge(
      'hangar_mirror_download_bytes_per_second',
      "The mirror's downloads' summed recent rate, as the transfers record it",
      [],
      (g, s) => g.set(s.files.reduce((sum, f) => sum + f.bytesPerSecond, 0)),
    );
    gauge('hangar_mirror_leases_held', 'Mirror transfers a server process holds a live lease on', [], (g, s) =>
      g.set(s.leases),
    );
    gauge('hangar_mirror_retrying_files', 'Mirror transfers waiting to try an unreachable upstream again', [], (g, s) =>
      g.set(s.retrying),
    );
    gauge('hangar_mirror_failed_files', 'FAILED mirror files by why they failed', ['reason'], (g, s) => {
      for (const [reason, n] of s.failures) g.set({ reason }, n);
    });
    gauge('hangar_nodes', 'Nodes, by whether their agent reported in the last 30 s', ['online'], (g, s) => {
      g.set({ online: 'true' }, s.nodes.filter((n) => n.online).length);
      g.set({ online: 'false' }, s.nodes.filter((n) => !n.online).length);
    });
    gauge(
      'hangar_node_gpu_memory_bytes',
      'GPU memory of online nodes as their agents last reported it, by node, GPU and kind (total, free)',
      ['node', 'gpu', 'kind'],
      (g, s) => {
        for (const n of s.nodes.filter((x) => x.online)) {
          for (const gpu of n.gpus) {
            g.set({ node: n.name, gpu: String(gpu.index), kind: 'total' }, gpu.totalMiB * 2 ** 20);
            g.set({ node: n.name, gpu: String(gpu.index), kind: 'free' }, gpu.freeMiB * 2 ** 20);
          }
        }
      },
    );
    gauge('hangar_replicas', 'Replicas by state', ['state'], (g, s) => {
      for (const r of s.replicas) g.set({ state: r.state }, r.count);
    });
    gauge('hangar_train_jobs', 'Training jobs by state', ['state'], (g, s) => {
      for (const j of s.trainJobs) g.set({ state: j.state }, j.count);
    });
    gauge('hangar_train_steps_per_second', 'Training steps reported over the last minute, per second', [], (g, s) =>
      g.set(s.trainSteps / 60),
    );
    new Gauge({
      name: 'hangar_metrics_database_up',
      help: 'Whether this scrape could read the database (1) or not (0): without it, the figures above are absent',
      registers,
      aggregator: 'max',
      async collect() {
        this.set((await read()) ? 1 : 0);
      },
    });
  }

  /** One snapshot per scrape; scrapes within a second share it. Undefined while the database cannot be read. */
  private read(): Promise<Snapshot | undefined> {
    const now = Date.now();
    if (!this.snapshot || now - this.snapshot.at > 1000) {
      this.snapshot = {
        at: now,
        value: this.query().catch((err: unknown) => {
          this.deps.log.warn('metrics: the database could not be read; its figures are left out of this scrape', {
            error: err instanceof Error ? err.message : String(err),
          });
          return undefined;
        }),
      };
    }
    return this.snapshot.value;
  }

  private async query(): Promise<Snapshot> {
    const { db } = this.deps;
    // Leases are deadlines on the database's clock (db/clock.ts).
    const now = db.clock.now();
    const [files, failed, leases, retrying, nodes, replicas, trainJobs, trainSteps] = await Promise.all([
      db.mirrorFile.groupBy({
        by: ['state'],
        _count: { _all: true },
        _sum: { bytesTotal: true, bytesDone: true, bytesPerSecond: true },
      }),
      db.mirrorFile.groupBy({ by: ['error'], where: { state: 'FAILED' }, _count: { _all: true } }),
      db.mirrorFile.count({ where: { leaseUntil: { gt: now } } }),
      db.mirrorFile.count({ where: { retryAt: { not: null }, state: { not: 'FAILED' } } }),
      db.node.findMany({ select: { name: true, lastSeenAt: true, leftAt: true, gpus: true } }),
      db.replica.groupBy({ by: ['state'], _count: { _all: true } }),
      db.trainJob.groupBy({ by: ['state'], _count: { _all: true } }),
      db.trainMetric.count({ where: { at: { gt: new Date(now.getTime() - 60_000) } } }),
    ]);
    const failures = new Map<string, number>();
    for (const f of failed) {
      const reason = failureClass(f.error);
      failures.set(reason, (failures.get(reason) ?? 0) + f._count._all);
    }
    return {
      files: files.map((f) => ({
        state: f.state,
        count: f._count._all,
        bytesTotal: Number(f._sum.bytesTotal ?? 0),
        bytesDone: Number(f._sum.bytesDone ?? 0),
        bytesPerSecond: f.state === 'FETCHING' ? (f._sum.bytesPerSecond ?? 0) : 0,
      })),
      failures,
      leases,
      retrying,
      nodes: nodes.map((n) => ({
        name: n.name,
        online: this.deps.isOnline(n),
        gpus: nodeGpus(n),
      })),
      replicas: replicas.map((r) => ({ state: r.state, count: r._count._all })),
      trainJobs: trainJobs.map((j) => ({ state: j.state, count: j._count._all })),
      trainSteps,
    };
  }
}
