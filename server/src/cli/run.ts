import { runCli } from './main.js';

// The entry bin/hangar.mjs imports for every command but `server` and `agent`. It exits once the command is done:
// an event stream still closing would keep the process alive otherwise.
process.exit(await runCli(process.argv.slice(2)));
