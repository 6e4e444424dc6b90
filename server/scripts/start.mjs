// `pnpm start` in one process: the console's check (web/scripts/build-if-changed.mjs), the server's
// (build-if-changed.mjs), then the server from dist, as `node dist/main.js` in server/ would run it. Three node processes one after another were a third of a second of every `pnpm start` (bench/start.ts)
// spent starting node. Each check ends the process with its message when its build fails, as `&&` did.
import { fileURLToPath } from 'node:url';

await import('../../web/scripts/build-if-changed.mjs');
await import('./build-if-changed.mjs');
// Where the server's relative defaults (HANGAR_DATA_DIR=./data) have always meant under `pnpm start`.
process.chdir(fileURLToPath(new URL('..', import.meta.url)));
// What production means to the libraries: graphql-js, for one, checks every instanceof twice otherwise (a
// tenth of the Mirror page's query at 5000 versions). An operator's own NODE_ENV stands.
process.env.NODE_ENV ??= 'production';
await import('../dist/main.js');
