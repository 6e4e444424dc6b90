import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import type { TestProject } from 'vitest/node';
import { loadConfig } from '../src/config.js';
import { startEmbeddedPostgres } from '../src/db/embedded.js';

declare module 'vitest' {
  export interface ProvidedContext {
    pgAdminUrl: string;
  }
}

/** A real PostgreSQL for the tests: DATABASE_URL's server when set, otherwise one embedded cluster for the run. */
export default async function setup(project: TestProject) {
  const { databaseUrl } = loadConfig();
  if (databaseUrl) {
    project.provide('pgAdminUrl', databaseUrl);
    return;
  }
  // Not mkdtemp: its 0700 would keep PostgreSQL's own user out of the directory.
  const dir = path.join(os.tmpdir(), `hangar-test-pg-${process.pid}`);
  await fs.mkdir(dir, { recursive: true, mode: 0o755 });
  const pg = await startEmbeddedPostgres(path.join(dir, 'pg'), createLogger('warn'));
  project.provide('pgAdminUrl', pg.url('postgres'));
  return async () => {
    await pg.stop();
    await fs.rm(dir, { recursive: true, force: true });
  };
}
