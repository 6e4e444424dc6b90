#!/usr/bin/env node
// `hangar-agent` (and the server's `hangar agent`): runs the node agent. A checkout (src/ is there) runs the
// TypeScript through tsx, so an edit is never answered by yesterday's bundle; the agent starts once and runs for
// days, so the 2 s tsx costs at start (server/bench/start.ts) do not matter here. An image ships dist/agent.js
// without the sources (Dockerfile.agent): that is what there is, and what runs.
import { existsSync } from 'node:fs';

if (existsSync(new URL('../src/main.ts', import.meta.url))) {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/main.ts');
} else {
  // Stack traces then name the TypeScript file and line, as under tsx.
  process.setSourceMapsEnabled(true);
  await import('../dist/agent.js');
}
