import type { Config } from '../config.js';
import { connectionBudget } from '../db/connections.js';

// What each of HANGAR_WORKERS' processes may take of the limits the operator set for the server as a whole.
// Every worker is a full server process with limits of its own, in memory; the kernel's connections reach them
// in turn (node:cluster's round robin: the primary accepts and hands each connection to the next worker), so a
// client's connections spread evenly over the workers. A limit that caps what one server holds is divided
// among the workers, rounded up: together they never hold more than the setting (plus the rounding), though
// one worker may refuse a little before the setting is reached across all of them. The alternative, asking one
// another at every connection, would put a round trip between processes on every accept.
// Left per worker (documented in the README): the database pools (the connection budget is per process, so N×),
// the mirror's concurrency, as in any replica the in-memory caches that follow the database's events, and
// HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: a console tab's subscriptions all ride its one WebSocket, so they all land
// on one worker, and a share of the limit would refuse that tab at 1/N of what the operator set.

/** The config one worker runs with, when `workers` processes share the port. */
export function workerShare(config: Config, workers: number): Config {
  if (workers <= 1) return config;
  const share = (n: number) => Math.max(1, Math.ceil(n / workers));
  return {
    ...config,
    maxConnections: share(config.maxConnections),
    maxConnectionsPerAddress: share(config.maxConnectionsPerAddress),
    maxConnectionsPerCaller: share(config.maxConnectionsPerCaller),
    maxPendingConnections: share(config.maxPendingConnections),
    gatewayWakeQueue: Math.ceil(config.gatewayWakeQueue / workers),
    // A cap on the site's link: the workers' downloads together keep to it (64 KiB/s each at least, as parseRate).
    mirrorBandwidth:
      config.mirrorBandwidth === null ? null : Math.max(65_536, Math.floor(config.mirrorBandwidth / workers)),
  };
}

/**
 * The connections the embedded PostgreSQL must accept: every worker's whole budget (db/connections.ts), the
 * primary's while it migrates, and room for `psql` and the CLI. The default 200 covers five workers.
 */
export function embeddedConnections(config: Config): number {
  return (config.workers + 1) * connectionBudget(config.dbPoolSizes) + 20;
}
