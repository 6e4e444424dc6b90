import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

// Regenerates what is generated from sources and committed: the Prisma client and Pothos types (from
// prisma/schema.prisma), then server/schema.graphql (from the Pothos schema, which depends on the first).
// `prisma generate` never runs the schema engine, but the CLI insists one exists: any file will do, which
// keeps this working without the network.
const here = path.dirname(new URL(import.meta.url).pathname);
const server = path.resolve(here, '..');
const placeholder = path.join(os.tmpdir(), 'hangar-no-schema-engine');
await fs.writeFile(placeholder, '');

execFileSync('pnpm', ['exec', 'prisma', 'generate'], {
  cwd: server,
  stdio: 'inherit',
  env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: placeholder, PRISMA_HIDE_UPDATE_MESSAGE: '1' },
});
// A fresh process: the schema must be built from the client just generated, not one already imported.
execFileSync('pnpm', ['exec', 'tsx', 'scripts/print-schema.ts'], { cwd: server, stdio: 'inherit' });
// Then the CLI's and the agent's typed documents (packages/common/src/client/graphql-env.d.ts, gql.tada) from that schema.
execFileSync('pnpm', ['exec', 'gql.tada', 'generate', 'output'], { cwd: server, stdio: 'inherit' });
// The operation names GraphQL's metrics may carry as labels (src/metrics/known-operations.ts), from the clients' documents.
execFileSync('pnpm', ['exec', 'tsx', 'scripts/known-operations.ts'], { cwd: server, stdio: 'inherit' });
