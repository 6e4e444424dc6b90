import type pg from 'pg';

// Every connection a server process opens to PostgreSQL, and what they add up to. An operator sizing
// max_connections (or a pooler in front of PostgreSQL) adds this up over the replicas; pg_stat_activity's
// application_name says which pool each connection belongs to.

/** What each pool calls itself in pg_stat_activity.application_name. */
export const CONNECTION_NAMES = {
  requests: 'hangar requests',
  loops: 'hangar loops',
  signIns: 'hangar sign-ins',
  events: 'hangar live events',
} as const;

/** The sign-in counters' pool (auth/login-limits.ts): sign-ins are few, and each holds its connection briefly. */
export const SIGN_IN_POOL_SIZE = 4;

/** The most connections one process holds: both Prisma pools, the sign-in counters' pool and the one LISTEN. */
export function connectionBudget(sizes: { requests: number; loops: number }): number {
  return sizes.requests + sizes.loops + SIGN_IN_POOL_SIZE + 1;
}

/**
 * The options every connection is opened with: its pool's name, and TCP keepalive, which finds a connection whose
 * peer vanished without closing it (the old primary's machine died) instead of waiting on it for good. No
 * connection timeout on the pools: node-postgres counts the wait for a free pooled connection in it, and a busy
 * console would then look like a database outage.
 */
export function connectionOptions(name: keyof typeof CONNECTION_NAMES): pg.ClientConfig {
  return { application_name: CONNECTION_NAMES[name], keepAlive: true };
}
