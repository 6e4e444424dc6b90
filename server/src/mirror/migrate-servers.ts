import type { Db, Tx } from '../db/client.js';
import { CONNECTION_NAMES } from '../db/connections.js';

// `hangar mirror migrate` runs with every server stopped: a server still running on `file` would go on writing
// new files under its data dir (and recording them on the `file` storage) while the rows are switched to the
// bucket, and serve files from a storage the database no longer says they are on. With the embedded database the
// database's own lock keeps a second process out; with an external DATABASE_URL nothing does, so the command
// looks for the servers itself. Every running server holds one LISTEN connection for its live events for as
// long as it runs (pubsub.ts: reconnected at once if it drops), named in pg_stat_activity.application_name
// (db/connections.ts); the command opens none, so any such connection on this database is a server.

export type RunningServer = { from: string; since: Date; backendPid: number };

/** The servers connected to this database now, by their LISTEN connection; none when every one is stopped. */
export async function runningServers(db: Db | Tx): Promise<RunningServer[]> {
  const rows = await db.$queryRaw<{ addr: string | null; port: number | null; since: Date; pid: number }[]>`
    SELECT host(client_addr) AS addr, client_port AS port, backend_start AS since, pid
    FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = ${CONNECTION_NAMES.events} AND pid <> pg_backend_pid()
    ORDER BY backend_start`;
  return rows.map((r) => ({
    // A Unix socket has no address (client_port -1): the server runs on the database's own machine.
    from: r.addr ? `${r.addr}:${r.port}` : 'a local socket',
    since: r.since,
    backendPid: r.pid,
  }));
}

/** The refusal's text when servers run (ending with `after`: what was left as it was), or null when none does. */
export function serversStillRunning(servers: RunningServer[], after: string): string | null {
  if (!servers.length) return null;
  const named = servers
    .slice(0, 5)
    .map(
      (s) =>
        `connected from ${s.from} since ${s.since.toISOString()} (PostgreSQL backend ${s.backendPid}, "${CONNECTION_NAMES.events}")`,
    )
    .join('; ');
  return (
    `${servers.length === 1 ? 'a Hangar server is' : `${servers.length} Hangar servers are`} still running on this database: ${named}${servers.length > 5 ? '; …' : ''}. ` +
    `Stop every server (every replica) that uses this DATABASE_URL and run this again: a running server would go on writing to the \`file\` mirror while its files move. ${after}`
  );
}
