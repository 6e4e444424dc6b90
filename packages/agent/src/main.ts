import { createLogger } from '@hangar/common/log';
import { createAgent } from './agent.js';
import { AgentConfigError, loadAgentConfig } from './config.js';
import { watchParent } from './parent-watch.js';

// `hangar-agent` (`pnpm agent`, or the server's `hangar agent`): start the node agent and nothing else.

let config: ReturnType<typeof loadAgentConfig>;
try {
  config = loadAgentConfig();
} catch (err) {
  if (!(err instanceof AgentConfigError)) throw err;
  process.stderr.write(`${err.message}\n`);
  process.exit(2);
}
const log = createLogger(config.logLevel);
const agent = createAgent(config, { log });

let stopping = false;
const shutdown = (signal: NodeJS.Signals | 'its parent process exited') => {
  // A second signal means "now": the operator has waited long enough.
  if (stopping) process.exit(1);
  stopping = true;
  log.info('stopping: telling the control plane this node leaves, then stopping and reporting its replicas', {
    signal,
  });
  agent.stop().then(
    () => process.exit(0),
    (err: unknown) => {
      log.error('the agent did not stop cleanly', { error: err });
      process.exit(1);
    },
  );
};
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
// A wrapper (pnpm) that dies without passing SIGTERM on must not leave the agent running: see parent-watch.ts.
watchParent(() => shutdown('its parent process exited'));

log.info('the Hangar agent is starting', { url: config.url, dir: config.dir });
try {
  await agent.start();
} catch (err) {
  // Only what the node itself refuses (its directory cannot be made, say): the control plane being away is not.
  log.error('the agent could not start', { error: err });
  process.exit(1);
}
