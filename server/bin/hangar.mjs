#!/usr/bin/env node
// `hangar` runs the server; `hangar agent` runs the node agent. Both are TypeScript run through tsx, as
// `pnpm start` and `pnpm agent` do, so the installed command and the scripts cannot drift apart.
import { register } from 'tsx/esm/api';

register();
const [command = 'server'] = process.argv.slice(2);
if (command === 'agent') await import('../src/agent/main.ts');
else if (command === 'server') await import('../src/main.ts');
else {
  process.stderr.write(`usage: hangar [server|agent] (got "${command}")\n`);
  process.exit(2);
}
