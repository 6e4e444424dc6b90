import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { schemaFile } from '../scripts/print-schema.js';
import { pendingSchemaDiff } from '../scripts/schema-diff.js';

// Generated files are committed so a reader (and a script author) sees them; these fail when one drifts from
// its source. The fix is always `pnpm generate` (or `pnpm migration:new <name>` for the database).

const server = path.resolve(new URL('..', import.meta.url).pathname);

describe('generated files', () => {
  it('server/schema.graphql matches the schema the code builds', async () => {
    // Printed by the same script `pnpm generate` runs, in its own process, as Node (not the test runner) loads it.
    const printed = execFileSync('pnpm', ['exec', 'tsx', 'scripts/print-schema.ts', '--stdout'], {
      cwd: server,
      encoding: 'utf8',
    });
    expect(await fs.readFile(schemaFile, 'utf8'), 'server/schema.graphql is stale: run pnpm generate').toBe(printed);
  });

  it("packages/common/src/client/graphql-env.d.ts (the CLI and agent documents' types) matches server/schema.graphql", async () => {
    // gql.tada reads the schema this file's neighbour test checks; written elsewhere and compared, as generate writes it.
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-tada-')), 'graphql-env.d.ts');
    execFileSync('pnpm', ['exec', 'gql.tada', 'generate', 'output', '--output', out], { cwd: server, stdio: 'pipe' });
    const committed = await fs.readFile(
      path.join(server, '..', 'packages', 'common', 'src', 'client', 'graphql-env.d.ts'),
      'utf8',
    );
    expect(committed, 'packages/common/src/client/graphql-env.d.ts is stale: run pnpm generate').toBe(
      await fs.readFile(out, 'utf8'),
    );
    await fs.rm(path.dirname(out), { recursive: true, force: true });
  }, 60_000);

  it('prisma/migrations bring a database to exactly prisma/schema.prisma', async () => {
    expect(await pendingSchemaDiff(), 'schema.prisma changed without a migration: run pnpm migration:new <name>').toBe(
      '',
    );
  }, 60_000);

  it('the committed Prisma client and Pothos types match schema.prisma', async () => {
    // The same schema file at the same depth, so every relative path it names (and embeds) is the same.
    const out = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-gen-'));
    await fs.mkdir(path.join(out, 'prisma'));
    await fs.copyFile(path.join(server, '..', 'prisma', 'schema.prisma'), path.join(out, 'prisma', 'schema.prisma'));
    const placeholder = path.join(out, 'no-engine');
    await fs.writeFile(placeholder, '');
    execFileSync('pnpm', ['exec', 'prisma', 'generate', '--schema', path.join(out, 'prisma', 'schema.prisma')], {
      cwd: server,
      stdio: 'pipe',
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: placeholder, PRISMA_HIDE_UPDATE_MESSAGE: '1' },
    });
    const committed = await listFiles(path.join(server, 'src', 'generated'));
    const fresh = await listFiles(path.join(out, 'server', 'src', 'generated'));
    expect(Object.keys(fresh).sort()).toEqual(Object.keys(committed).sort());
    for (const [name, text] of Object.entries(fresh)) {
      expect(committed[name], `src/generated/${name} is stale: run pnpm generate`).toBe(text);
    }
    await fs.rm(out, { recursive: true, force: true });
  }, 60_000);
});

async function listFiles(root: string, skip: string[] = []): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await fs.readdir(root, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || skip.includes(entry.name)) continue;
    const full = path.join(entry.parentPath, entry.name);
    out[path.relative(root, full)] = await fs.readFile(full, 'utf8');
  }
  return out;
}
