import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import pg from 'pg';
import { inject } from 'vitest';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { createPrisma } from '../src/db/client.js';
import type { Database } from '../src/db/database.js';
import { migrate } from '../src/db/migrate.js';

export const ADMIN_EMAIL = 'admin@example.com';
export const ADMIN_PASSWORD = 'correct-horse-battery';

/** A database of its own for one test file, in the run's PostgreSQL, migrated the way the server does it. */
export async function freshDatabase(): Promise<Database> {
  const admin = inject('pgAdminUrl');
  const name = `hangar_test_${randomBytes(5).toString('hex')}`;
  const client = new pg.Client({ connectionString: admin });
  await client.connect();
  await client.query(`CREATE DATABASE ${name}`);
  await client.end();
  const url = new URL(admin);
  url.pathname = `/${name}`;
  await migrate(url.toString(), createLogger('silent'));
  const prisma = createPrisma(url.toString());
  return {
    prisma,
    url: url.toString(),
    embedded: false,
    close: async () => {
      await prisma.$disconnect();
      const c = new pg.Client({ connectionString: admin });
      await c.connect();
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}

export type GqlOptions = { token?: string; cookie?: string; csrf?: string; headers?: Record<string, string> };
export type GqlResult<T = Record<string, unknown>> = {
  status: number;
  data?: T;
  errors?: { message: string; extensions?: Record<string, unknown> }[];
  headers: Headers;
};

export type TestApp = {
  /** The running app; replaced by restart(). */
  app: App;
  /** Stops the app (gracefully, as SIGTERM would) and starts a new one on the same database and data dir. */
  restart(): Promise<App>;
  /**
   * Another server on the same database, as a second replica would be, with `env` over this one's settings
   * (HANGAR_DATA_DIR to give it other storage). Built, not started; close() stops it.
   */
  replica(env?: Record<string, string>): Promise<App>;
  dataDir: string;
  /** Runs an operation in-process through Yoga, as an HTTP request would arrive. */
  gql<T = Record<string, any>>(
    query: string,
    variables?: Record<string, unknown>,
    o?: GqlOptions,
  ): Promise<GqlResult<T>>;
  /** Signs in as the first admin (or the given user) and returns the cookie and CSRF token. */
  login(email?: string, password?: string): Promise<{ cookie: string; csrf: string }>;
  /** An API token with the given role, made by the admin. */
  token(role?: 'ADMIN' | 'OPERATOR' | 'VIEWER', name?: string): Promise<string>;
  close(): Promise<void>;
};

export async function startTestApp(
  env: Record<string, string> = {},
  // Another way to the database (the outage tests pass one through a relay they can cut).
  options: { database?: () => Promise<Database> } = {},
): Promise<TestApp> {
  const database = await (options.database ?? freshDatabase)();
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-data-'));
  const settings = {
    HANGAR_DATA_DIR: dataDir,
    HANGAR_ADMIN_EMAIL: ADMIN_EMAIL,
    HANGAR_ADMIN_PASSWORD: ADMIN_PASSWORD,
    HANGAR_LOG_LEVEL: 'silent',
    PORT: '0',
    HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
    // The stand-in upstreams and Hubs listen on loopback, which the server refuses to fetch from unless listed.
    HANGAR_FETCH_ALLOW: '127.0.0.1',
    ...env,
  };
  const config = loadConfig(settings);
  const replicas: App[] = [];
  let app = await createApp({ config, log: createLogger(config.logLevel), database, print: () => {} });

  const gql: TestApp['gql'] = async (query, variables, o = {}) => {
    const body = JSON.stringify({ query, variables });
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      'content-length': String(Buffer.byteLength(body)),
      ...o.headers,
    };
    if (o.token) headers.authorization = `Bearer ${o.token}`;
    if (o.cookie) headers.cookie = o.cookie;
    if (o.csrf) headers['x-hangar-csrf'] = o.csrf;
    const res = await handle.app.yoga.fetch('http://hangar/graphql', { method: 'POST', headers, body });
    const json = (await res.json()) as { data?: any; errors?: GqlResult['errors'] };
    return { status: res.status, data: json.data, errors: json.errors, headers: res.headers };
  };

  const login: TestApp['login'] = async (email = ADMIN_EMAIL, password = ADMIN_PASSWORD) => {
    const r = await gql(
      'mutation($e: String!, $p: String!) { login(email: $e, password: $p) { __typename ... on LoginPayload { csrfToken } ... on Error { message } } }',
      { e: email, p: password },
    );
    if (r.data?.login.__typename !== 'LoginPayload') throw new Error(`login failed: ${JSON.stringify(r.data)}`);
    const cookie = r.headers
      .getSetCookie()
      .map((c) => c.split(';')[0])
      .join('; ');
    return { cookie, csrf: r.data.login.csrfToken };
  };

  let adminSession: { cookie: string; csrf: string } | undefined;
  const token: TestApp['token'] = async (role = 'ADMIN', name = `test-${role.toLowerCase()}`) => {
    adminSession ??= await login();
    const r = await gql(
      'mutation($i: CreateApiTokenInput!) { createApiToken(input: $i) { __typename ... on CreatedApiToken { secret } ... on Error { message } } }',
      { i: { name, role } },
      adminSession,
    );
    if (r.data?.createApiToken.__typename !== 'CreatedApiToken') throw new Error(JSON.stringify(r.data));
    return r.data.createApiToken.secret as string;
  };

  const handle: TestApp = {
    app,
    restart: async () => {
      await app.stop();
      app = await createApp({ config, log: createLogger(config.logLevel), database, print: () => {} });
      handle.app = app;
      return app;
    },
    replica: async (more = {}) => {
      const c = loadConfig({ ...settings, PORT: '0', ...more });
      const r = await createApp({ config: c, log: createLogger(c.logLevel), database, print: () => {} });
      replicas.push(r);
      return r;
    },
    dataDir,
    gql,
    login,
    token,
    close: async () => {
      for (const r of replicas) await r.stop();
      await app.stop();
      await database.close();
      await fs.rm(dataDir, { recursive: true, force: true });
    },
  };
  return handle;
}
