import cluster, { type Worker } from 'node:cluster';
import { withFields } from '@hangar/common/log';
import { backoffMs } from '@hangar/common/retry';
import type { App, AppOptions } from '../app.js';
import { relayScrapes } from '../metrics/cluster-metrics.js';
import { workerShare } from './workers-share.js';

// HANGAR_WORKERS: the server in several processes sharing its port (node:cluster), so that /v1 and the rest use
// every core; one Node process tops out at one core's worth of JavaScript (bench/gateway.ts). Each worker is a
// full server, as a replica behind a load balancer is (issue #30: replicas share PostgreSQL and nothing else; the
// background loops take leases and locks in the database), so nothing here shares a route table or a usage
// batch: each worker keeps its own, following the database's events. The primary serves nothing. It starts the
// embedded PostgreSQL once (main.ts), migrates and makes the first admin once (so the password is printed once),
// forks the workers with the database's URL, says "ready" once they all listen, restarts one that dies, relays
// /metrics between them (metrics/cluster-metrics.ts), and at a signal stops them all, then the database, last.

/** What main.ts starts and stops: the server itself, or with HANGAR_WORKERS above 1, the primary over it. */
export type Served = Pick<App, 'start' | 'stop'>;

/** Sent by a worker once its server listens and its loops have started. */
const LISTENING = 'hangar:listening';
/** A worker that listened this long and then died is restarted at once; one that dies sooner, after a backoff. */
const STEADY_MS = 60_000;
/** Tries a worker gets to start while the server starts, before the start fails with its reason. */
const START_TRIES = 3;

/** A worker exited during the start (a bad hangar.yaml, a database refusing it): the start fails with its words. */
export class WorkerStartError extends Error {
  override name = 'WorkerStartError';
}

/**
 * main.ts's app: with HANGAR_WORKERS=1 the server as always; in a worker, the server with the worker's share of
 * the limits (workers-share.ts) and its log lines marked with the worker's number; in the primary, the primary.
 * `entry`: the file a worker runs (main.ts, or dist/main.js in the bundle).
 */
export async function createApp(options: AppOptions & { entry: string }): Promise<Served> {
  const { config, log } = options;
  if (config.workers > 1 && cluster.isPrimary) return primary(options);
  const { createApp: createServer } = await import('../app.js');
  if (!cluster.isWorker) return createServer(options);
  const app = await createServer({
    ...options,
    config: workerShare(config, config.workers),
    log: withFields(log, { worker: cluster.worker?.id }),
  });
  return {
    stop: () => app.stop(),
    start: async () => {
      const url = await app.start();
      process.send?.({ hangar: LISTENING, url });
      return url;
    },
  };
}

function primary({ config, log, embedded, entry, print }: AppOptions & { entry: string }): Served {
  let stopping = false;
  let databaseUrl = config.databaseUrl;
  /** Each slot's worker now, and how many times in a row it died young. */
  const slots: { worker?: Worker; listeningSince?: number; failures: number }[] = Array.from(
    { length: config.workers },
    () => ({ failures: 0 }),
  );
  let firstListening: ((url: string) => void) | undefined;
  let startFailed: ((err: Error) => void) | undefined;

  const fork = (slot: number) => {
    // Its settings are the primary's environment; only the database is the one resolved here (the embedded one's
    // URL, with its password: environments are readable by this user alone, as the password file is).
    const worker = cluster.fork(databaseUrl ? { DATABASE_URL: databaseUrl } : {});
    const s = slots[slot] as (typeof slots)[number];
    s.worker = worker;
    s.listeningSince = undefined;
    log.info('started a worker', { worker: worker.id, pid: worker.process.pid, of: config.workers });
    worker.on('message', (m: { hangar?: string; url?: string }) => {
      if (m?.hangar !== LISTENING || typeof m.url !== 'string') return;
      s.listeningSince = Date.now();
      if (firstListening && slots.every((x) => x.listeningSince)) firstListening(m.url);
      else if (!firstListening)
        log.info('the restarted worker listens', { worker: worker.id, pid: worker.process.pid });
    });
    worker.on('exit', (code, signal) => {
      if (s.worker === worker) s.worker = undefined;
      if (stopping) return;
      if (startFailed) {
        s.failures++;
        // 2: a refusal that says all (a setting, the migrations, the storage: main.ts), the same at every try.
        if (code === 2 || s.failures >= START_TRIES) {
          startFailed(
            new WorkerStartError(
              `worker ${worker.id} (process ${worker.process.pid}) exited during the start (${signal ?? `code ${code}`}${s.failures > 1 ? `, ${s.failures} tries` : ''}); its reason is above`,
            ),
          );
          return;
        }
        // Anything else may be the moment (the database briefly away, a port not yet free after a restart):
        // another try, a moment later. (Workers starting together once met each other in PostgreSQL setting up
        // its triggers, a deadlock: db/triggers.ts now leaves triggers already installed alone.)
        const waitMs = backoffMs(s.failures - 1, { baseMs: 500, maxMs: 5000, jitter: 0.5 });
        log.warn('a worker failed to start; starting it again', { worker: worker.id, code, signal, inMs: waitMs });
        setTimeout(() => {
          if (!stopping) fork(slot);
        }, waitMs);
        return;
      }
      const young = !s.listeningSince || Date.now() - s.listeningSince < STEADY_MS;
      s.failures = young ? s.failures + 1 : 0;
      const waitMs = s.failures ? backoffMs(s.failures - 1, { baseMs: 1000, maxMs: 30_000 }) : 0;
      log.error('a worker exited unexpectedly; the others go on serving, and it is started again', {
        worker: worker.id,
        pid: worker.process.pid,
        code,
        signal,
        inMs: waitMs,
      });
      setTimeout(() => {
        if (!stopping) fork(slot);
      }, waitMs);
    });
  };

  const stopWorkers = async () => {
    const live = slots.map((s) => s.worker).filter((w): w is Worker => w !== undefined && !w.isDead());
    // SIGTERM: each worker's own stop (main.ts), draining its requests. Ctrl-C in a terminal has already sent
    // them SIGINT (the whole process group gets it), and a worker takes the second within a second as the same.
    const exits = live.map((w) => new Promise<void>((r) => (w.isDead() ? r() : w.once('exit', () => r()))));
    for (const w of live) w.process.kill('SIGTERM');
    // Past their drain (HANGAR_SHUTDOWN_GRACE_MS) and the rest of their stop, a worker still running is stuck.
    const stuck = setTimeout(() => {
      for (const w of live) {
        if (w.isDead()) continue;
        log.warn('a worker did not stop in time; killing it', { worker: w.id, pid: w.process.pid });
        w.process.kill('SIGKILL');
      }
    }, config.shutdownGraceMs + 30_000);
    await Promise.all(exits);
    clearTimeout(stuck);
  };

  return {
    start: async () => {
      const db = await (await import('../db/database.js')).openDatabase(config, log, embedded);
      try {
        databaseUrl = db.url;
        // The first admin, once, here: its generated password is printed by this process alone, before any
        // worker runs (each worker still looks, finds it, and prints nothing).
        const [{ AuthService }, { AuditService }, { LoginLimits }] = await Promise.all([
          import('../auth/auth.service.js'),
          import('../audit/audit.service.js'),
          import('../auth/login-limits.js'),
        ]);
        const loginLimits = new LoginLimits(db.url);
        try {
          const audit = new AuditService(db.prisma, log);
          await new AuthService(db.prisma, config, audit, log, loginLimits).ensureFirstAdmin(
            print ?? ((t) => process.stdout.write(`${t}\n`)),
          );
        } finally {
          await loginLimits.close();
        }
      } catch (err) {
        await db.close();
        throw err;
      }
      // Its connections are not kept: the workers have theirs (the embedded PostgreSQL stays, for them).
      await db.prisma.$disconnect();
      relayScrapes();
      cluster.setupPrimary({ exec: entry });
      const listening = new Promise<string>((resolve, reject) => {
        firstListening = resolve;
        startFailed = reject;
      });
      for (let slot = 0; slot < slots.length; slot++) fork(slot);
      try {
        const url = await listening;
        log.info('every worker listens', { workers: config.workers, url });
        return url;
      } catch (err) {
        stopping = true;
        await stopWorkers();
        await (await embedded)?.stop();
        throw err;
      } finally {
        firstListening = undefined;
        startFailed = undefined;
      }
    },
    stop: async () => {
      stopping = true;
      await stopWorkers();
      log.info('every worker stopped');
      // Last: the workers' requests and loops needed it until they ended.
      await (await embedded)?.stop();
    },
  };
}
