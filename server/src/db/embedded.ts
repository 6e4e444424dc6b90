import { type ChildProcess, execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from '@hangar/common/free-port';
import type { Logger } from '@hangar/common/log';
import { backoffMs, sleep, waitUntil } from '@hangar/common/retry';
import EmbeddedPostgres, { startDetached } from './embedded-postgres.js';

export type EmbeddedDatabase = {
  url: (database: string) => string;
  stop: () => Promise<void>;
  /** Hangar has begun to stop: a PostgreSQL that exits from now on is not started again (stop() follows). */
  stopping: () => void;
  /** Why the embedded PostgreSQL is not serving right now (it exited and is being restarted), or null. */
  trouble: () => string | null;
};

/** Where the embedded PostgreSQL keeps its data under HANGAR_DATA_DIR. */
export const embeddedDataDir = (dataDir: string) => path.join(dataDir, 'pg');

/** The embedded PostgreSQL could not be started; the message says why, with PostgreSQL's own last words. */
export class EmbeddedPostgresError extends Error {}

const READY_TIMEOUT_MS = 120_000;
const LEFTOVER_STOP_MS = 30_000;

/**
 * A real PostgreSQL under the data dir, so `pnpm start` needs nothing installed: initialised on first start,
 * started and stopped with the server, keeping its data across restarts. Supervised: if it dies (the OOM killer,
 * a crash, somebody's kill), it is started again on the same port, so the connection pools and the event
 * listener reconnect to the same URL without being told.
 */
export async function startEmbeddedPostgres(
  dir: string,
  log: Logger,
  /** Connections it accepts: 200, or what HANGAR_WORKERS' processes may hold together (serve/workers-share.ts). */
  {
    maxConnections = 200,
    underWay,
  }: {
    maxConnections?: number;
    /**
     * Called once the slow part runs in processes of its own (the postmaster spawned, or initdb on a first start),
     * so that main.ts can load the rest of the server meanwhile (see there).
     */
    underWay?: () => void;
  } = {},
): Promise<EmbeddedDatabase> {
  // PostgreSQL runs as its own user (it refuses root), so every directory above its data must be traversable.
  await fs.mkdir(path.dirname(dir), { recursive: true, mode: 0o755 });
  const passwordFile = `${dir}.password`;
  const ownerFile = `${dir}.owner`;
  const fresh = !existsSync(path.join(dir, 'PG_VERSION'));
  let password: string;
  if (fresh) {
    // A leftover half-initialised directory (a crash during initdb) would make initdb refuse: start clean.
    await fs.rm(dir, { recursive: true, force: true });
    password = randomBytes(18).toString('base64url');
    await fs.writeFile(passwordFile, password, { mode: 0o600 });
  } else {
    await stopLeftover(dir, ownerFile, log);
    password = (await fs.readFile(passwordFile, 'utf8')).trim();
  }
  const port = await freePort();
  // PostgreSQL's own lines go to the debug log; the last of them are kept for the message when it fails.
  const lastLines: string[] = [];
  // Only this machine may connect, and no Unix socket in a system directory that may not exist or be writable.
  const postgresFlags = [
    '-c',
    'listen_addresses=127.0.0.1',
    '-c',
    'unix_socket_directories=',
    '-c',
    `max_connections=${Math.max(200, maxConnections)}`,
  ];
  const onLog = (m: string) => {
    for (const line of m.split('\n')) {
      if (!line.trim()) continue;
      lastLines.push(line.trim());
      if (lastLines.length > 20) lastLines.shift();
      log.debug('postgres', { line: line.trim() });
    }
  };
  const pg = new EmbeddedPostgres({
    databaseDir: dir,
    port,
    user: 'postgres',
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: true,
    postgresFlags,
    onLog,
    onError: (e) => log.warn('postgres', { error: e instanceof Error ? e.message : String(e) }),
  });
  const child = () => (pg as unknown as { process?: ChildProcess }).process;
  const forget = () => {
    (pg as unknown as { process?: ChildProcess }).process = undefined;
  };
  const saying = () => (lastLines.length ? `; PostgreSQL said: ${lastLines.slice(-6).join(' | ')}` : '');

  const spawned = () => {
    // When, in the process's time (as `modules` in the start phases): whether it boots beside the server's loading.
    log.debug('spawned the embedded PostgreSQL', { sinceProcessStartMs: Math.round(performance.now()) });
    underWay?.();
  };
  /** Starts the postmaster and resolves once it accepts connections; its failure carries PostgreSQL's words. */
  const startOnce = async () => {
    lastLines.length = 0;
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        // In a session of its own, so that only Hangar stops it (embedded-postgres.ts says why).
        startDetached(pg, { databaseDir: dir, port, postgresFlags, onLog, onSpawn: spawned }).catch((err: unknown) => {
          throw new EmbeddedPostgresError(
            `the embedded PostgreSQL in ${dir} did not start${err ? ` (${err instanceof Error ? err.message : String(err)})` : ''}${saying()}`,
          );
        }),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () =>
              reject(
                new EmbeddedPostgresError(
                  `the embedded PostgreSQL in ${dir} was not ready after ${READY_TIMEOUT_MS / 1000} s${saying()}`,
                ),
              ),
            READY_TIMEOUT_MS,
          );
        }),
      ]);
    } catch (err) {
      const proc = child();
      if (proc && proc.exitCode === null && proc.signalCode === null) proc.kill('SIGQUIT');
      forget();
      throw err;
    } finally {
      clearTimeout(timer);
    }
    // Whose it is, for the next start after a kill -9 of this process (see stopLeftover).
    await fs.writeFile(ownerFile, String(process.pid)).catch(() => {});
  };

  const started = Date.now();
  if (fresh) {
    try {
      const initialising = pg.initialise();
      underWay?.();
      await initialising;
    } catch (err) {
      throw new EmbeddedPostgresError(
        `could not initialise the embedded PostgreSQL in ${dir}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    log.info('initialised the embedded PostgreSQL', { dir, ms: Date.now() - started });
  }
  await startOnce();
  log.info('started the embedded PostgreSQL', { dir, port, ms: Date.now() - started });

  let stopping = false;
  let trouble: string | null = null;
  const watch = () => {
    child()?.once('exit', (code, signal) => {
      if (stopping) return;
      forget(); // so that stop() does not wait for an exit that has happened
      trouble = 'the embedded PostgreSQL exited; restarting it';
      log.error('the embedded PostgreSQL exited; restarting it on the same port', {
        code,
        signal,
        lastLines: lastLines.slice(-6),
      });
      void restart();
    });
  };
  // Backs off while it cannot start (the dead postmaster's last sessions still hold its shared memory for a
  // moment; the port is briefly taken): 1 s, 2 s, 4 s … up to 10 s between tries, and never gives up.
  const restart = async () => {
    let lastFailure = '';
    for (let attempt = 1; !stopping; attempt++) {
      await sleep(backoffMs(attempt - 1, { baseMs: 1000, maxMs: 10_000 }));
      if (stopping) return;
      try {
        await startOnce();
      } catch (err) {
        const why = (err as Error).message;
        if (why !== lastFailure) log.warn('the embedded PostgreSQL did not start again yet; retrying', { error: why });
        lastFailure = why;
        continue;
      }
      if (stopping) {
        await pg.stop().catch(() => {});
        return;
      }
      trouble = null;
      log.info('restarted the embedded PostgreSQL', { port, attempts: attempt });
      watch();
      return;
    }
  };
  watch();

  const url = (database: string) =>
    `postgresql://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  // A Hangar that ends without stop() (an uncaught exception) does not leave its PostgreSQL running on the data
  // dir: the postmaster is in a session of its own now, and nothing else would tell it. A fast shutdown, which
  // PostgreSQL finishes on its own. (kill -9 runs no handler: the next start stops that leftover.)
  const stopOnExit = () => {
    const proc = child();
    if (proc && proc.exitCode === null && proc.signalCode === null) proc.kill('SIGINT');
  };
  process.on('exit', stopOnExit);
  let stopped: Promise<void> | undefined;
  return {
    url,
    trouble: () => trouble,
    stopping: () => {
      stopping = true;
    },
    stop: () => {
      stopping = true;
      stopped ??= (async () => {
        const proc = child();
        if (proc && proc.exitCode === null && proc.signalCode === null) await pg.stop();
        else forget();
        process.removeListener('exit', stopOnExit);
        await fs.rm(ownerFile, { force: true });
        log.info('stopped the embedded PostgreSQL');
      })();
      return stopped;
    },
  };
}

/**
 * After a kill -9 or an OOM kill of Hangar, its PostgreSQL lives on, holding the data dir, and a new start would
 * fail on its lock file. A PostgreSQL still running on this data dir whose parent is no longer the Hangar that
 * started it is stopped (a fast shutdown: its sessions end, it writes a checkpoint) before starting afresh.
 * Anything else named by the lock file is refused with a message, never killed.
 */
async function stopLeftover(dir: string, ownerFile: string, log: Logger) {
  const lockFile = path.join(dir, 'postmaster.pid');
  const lock = await fs.readFile(lockFile, 'utf8').catch(() => null);
  if (lock === null) return;
  const [pidLine, dataDirLine] = lock.split('\n');
  const pid = Number(pidLine);
  // A lock file whose process is gone is stale: PostgreSQL checks that itself and takes the file over.
  if (!Number.isInteger(pid) || pid <= 0 || !alive(pid)) return;
  const proc = await describeProcess(pid);
  const onThisDir = dataDirLine !== undefined && path.resolve(dataDirLine.trim()) === path.resolve(dir);
  if (!proc || !/^(postgres|postmaster)$/.test(path.basename(proc.argv[0] ?? '')) || !onThisDir) {
    throw new EmbeddedPostgresError(
      `${lockFile} names process ${pid}, which is running but is not the PostgreSQL of ${dir}` +
        ` (${proc ? proc.argv.join(' ').slice(0, 200) : 'its command line cannot be read'}). If no PostgreSQL is` +
        ` using ${dir}, remove ${lockFile} and start Hangar again.`,
    );
  }
  const owner = Number((await fs.readFile(ownerFile, 'utf8').catch(() => '')).trim());
  if (owner > 0 && owner !== process.pid && proc.ppid === owner && alive(owner)) {
    throw new EmbeddedPostgresError(
      `another Hangar (process ${owner}) is running on this data dir (${path.dirname(dir)}) with its PostgreSQL` +
        ` (process ${pid}): stop it first, or give this one another HANGAR_DATA_DIR.`,
    );
  }
  log.warn('stopping a PostgreSQL left running on this data dir by an earlier Hangar (killed without stopping it?)', {
    pid,
    dir,
  });
  // SIGINT is PostgreSQL's fast shutdown; SIGQUIT, if that takes too long, its immediate one (the next start
  // replays the WAL, as after a power cut). Nothing is lost either way that was committed.
  for (const [signal, waitMs] of [
    ['SIGINT', LEFTOVER_STOP_MS],
    ['SIGQUIT', 10_000],
  ] as const) {
    try {
      process.kill(pid, signal);
    } catch {
      return; // gone meanwhile
    }
    if (await waitUntil(() => !alive(pid), { timeoutMs: waitMs, pollMs: 100 })) {
      log.info('stopped the leftover PostgreSQL', { pid });
      return;
    }
  }
  throw new EmbeddedPostgresError(
    `the PostgreSQL left running on ${dir} (process ${pid}) did not stop within ${LEFTOVER_STOP_MS / 1000 + 10} s; stop it, then start Hangar again`,
  );
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: it exists, as another user (PostgreSQL runs as its own when Hangar runs as root).
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** A process's command line and parent, from /proc where there is one, or from ps (macOS). */
async function describeProcess(pid: number): Promise<{ argv: string[]; ppid: number } | null> {
  try {
    const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8');
    const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8');
    // The second field is the command in parentheses and may itself hold spaces or parentheses.
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    return { argv: cmdline.split('\0').filter(Boolean), ppid };
  } catch {
    try {
      const { stdout } = await promisify(execFile)('ps', ['-o', 'ppid=', '-o', 'args=', '-p', String(pid)]);
      const m = stdout.trim().match(/^(\d+)\s+(.*)$/);
      return m ? { ppid: Number(m[1]), argv: (m[2] ?? '').split(/\s+/) } : null;
    } catch {
      return null;
    }
  }
}

export async function createDatabaseIfMissing(adminUrl: string, name: string): Promise<void> {
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (found.rowCount === 0) await client.query(`CREATE DATABASE "${name.replaceAll('"', '""')}"`);
  } finally {
    await client.end();
  }
}
