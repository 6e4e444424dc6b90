import type { Command } from 'commander';
import type { ExitCode } from './exit-codes.js';
import type { Out } from './output.js';
import type { HangarClient } from './session.js';

/** What every command gets: the settings, a client made on first use, its output, and how it sets the exit. */
export type Ctx = {
  env: NodeJS.ProcessEnv;
  client: () => Promise<HangarClient>;
  out: (cmd: Command) => Out;
  exit: (code: ExitCode) => void;
};
