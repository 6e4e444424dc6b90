import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { buildServer } from '../scripts/build.mjs';
import { checkServerBuild } from '../scripts/server-stamp.mjs';

// Production runs the bundle `pnpm build` makes, not the sources: this builds it and starts it as `pnpm start`
// does, on a database nobody has migrated, so the bundle must find the migrations, Prisma's client and its own
// config beside it as the sources do.

const serverDir = fileURLToPath(new URL('..', import.meta.url));
const children: ChildProcess[] = [];
let dataDir: string;
let dbUrl: string;
const dbName = `hangar_test_${randomBytes(5).toString('hex')}`;

async function sql(text: string) {
  const client = new pg.Client({ connectionString: inject('pgAdminUrl') });
  await client.connect();
  await client.query(text);
  await client.end();
}

beforeAll(async () => {
  await sql(`CREATE DATABASE ${dbName}`);
  const url = new URL(inject('pgAdminUrl'));
  url.pathname = `/${dbName}`;
  dbUrl = url.toString();
  dataDir = path.join(os.tmpdir(), `hangar-build-test-${process.pid}`);
  await fs.mkdir(dataDir, { recursive: true, mode: 0o755 });
  await buildServer();
}, 60_000);

afterAll(async () => {
  for (const child of children) {
    if (child.exitCode === null) {
      const ended = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await ended;
    }
  }
  await sql(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  await fs.rm(dataDir, { recursive: true, force: true });
});

/** Starts a file of dist/ and resolves with what it logged once it said it listens (or its exit and output). */
function start(file: string, env: Record<string, string>) {
  const child = spawn(process.execPath, [file], {
    cwd: serverDir,
    // Only what this test sets: the run's own environment must not decide which database the bundle uses.
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  // The log goes to stderr, stdout only carries what the operator is told (the first admin's password).
  let stderr = '';
  child.stderr?.on('data', (c) => (stderr += c));
  child.stdout?.resume();
  const lines = readline.createInterface({ input: child.stderr as NodeJS.ReadableStream });
  return new Promise<{ url?: string; code?: number | null; stderr: string }>((resolve) => {
    lines.on('line', (line) => {
      if (!line.includes('"Hangar is listening"')) return;
      resolve({ url: (JSON.parse(line) as { url: string }).url, stderr });
    });
    child.on('exit', (code) => resolve({ code, stderr }));
  });
}

describe('the built server', () => {
  it('is stamped current for the sources it was built from', async () => {
    expect(await checkServerBuild(serverDir)).toEqual({ current: true });
    for (const file of ['main.js', 'main.js.map']) {
      await expect(fs.stat(path.join(serverDir, 'dist', file))).resolves.toBeTruthy();
    }
  });

  it('imports the packages only some requests use when those come, not at every start', async () => {
    // What runs before the server does anything (bench/start.ts): the packages bundled into dist/main.js (its
    // source map names their files) and those it imports statically (`import … from "<package>"`).
    const bundle = await fs.readFile(path.join(serverDir, 'dist', 'main.js'), 'utf8');
    const statics = [...bundle.matchAll(/(?:^|;)import\s*[\w${},*\s]*?from\s*"([^"]+)"/gm)].map((m) => m[1]);
    const map = JSON.parse(await fs.readFile(path.join(serverDir, 'dist', 'main.js.map'), 'utf8')) as {
      sources: string[];
    };
    const bundled = new Set(
      map.sources.flatMap(
        (s) => /node_modules\/(?:\.pnpm\/[^/]+\/node_modules\/)?((?:@[^/]+\/)?[^/]+)/.exec(s)?.[1] ?? [],
      ),
    );
    const atStart = [...statics, ...bundled];
    // Loaded at every start, as one file rather than Node's ~300 (scripts/build.mjs).
    expect(bundled).toContain('graphql-yoga');
    const lazy = ['openai', 'undici', 'marked', 'sanitize-html', 'unpdf', '@huggingface/hub', 'node-llama-cpp', 'yaml'];
    // The mirror's S3 store (mirror/store/s3-store.ts): only a bucket's mirror loads the AWS SDK and hash-wasm.
    lazy.push('hash-wasm');
    // @opentelemetry/api is graphql-yoga's (a no-op without the SDK); the SDK and its exporters load with tracing.
    expect(
      atStart.filter(
        (s) =>
          lazy.includes(s as string) ||
          (s?.startsWith('@opentelemetry/') && s !== '@opentelemetry/api') ||
          s?.startsWith('@aws-sdk/'),
      ),
    ).toEqual([]);
  });

  it("leaves out what Hangar never runs: zod's other languages, graphql-jit's JSON serializer", async () => {
    // 0.6 MB of the bundle, parsed at every start, and an Ajv built at every start (scripts/build.mjs). The
    // queries graphql-jit compiles are answered below ('migrates an empty database…').
    const map = JSON.parse(await fs.readFile(path.join(serverDir, 'dist', 'main.js.map'), 'utf8')) as {
      sources: string[];
    };
    const locales = map.sources.filter((s) => /zod\/v4\/locales\/\w+\.js$/.test(s) && !s.includes('zod-english-only'));
    expect(locales.map((s) => path.basename(s))).toEqual(['en.js']);
    const serializer = map.sources.filter((s) => /node_modules\/(ajv|fast-json-stringify|fast-uri)\//.test(s));
    expect(serializer).toEqual([]);
    expect(map.sources.some((s) => s.includes('/graphql-jit/'))).toBe(true);
  });

  it("reads Prisma's query compiler from its file when the client asks, keeping no module of it", async () => {
    // The generated client imports a module whose one export is the wasm in base64 (4.4 MB): imported, its
    // source and its string would stay in the heap for good. The bundle has its own module in that one's place
    // (scripts/build.mjs); the start below proves that the client still gets its compiler from it.
    const bundle = await fs.readFile(path.join(serverDir, 'dist', 'main.js'), 'utf8');
    expect(bundle).not.toMatch(/import\(\s*"@prisma\/client\/runtime\/[^"]*wasm-base64/);
    expect(bundle).toContain('prisma-wasm-on-demand:@prisma/client/runtime/query_compiler_');
  });

  it('boots its embedded PostgreSQL while the rest of the server loads, and serves from it once ready', async () => {
    // A restart on an existing data directory (the first start below makes it), as an operator's after an upgrade.
    const env = {
      HANGAR_DATA_DIR: path.join(dataDir, 'embedded'),
      PORT: '0',
      HANGAR_LOG_LEVEL: 'debug',
      HANGAR_ADMIN_EMAIL: 'admin@example.com',
      HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
      HANGAR_HUB_URL: 'off',
    };
    const stopLast = async () => {
      const child = children.at(-1) as ChildProcess;
      const ended = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await ended;
    };
    const first = await start('dist/main.js', env);
    expect(first.url, `the first start failed: exit ${first.code}: ${first.stderr.slice(-2000)}`).toBeDefined();
    await stopLast();
    const started = await start('dist/main.js', env);
    expect(started.url, `the restart failed: exit ${started.code}: ${started.stderr.slice(-2000)}`).toBeDefined();
    // Ready means ready: the first requests after it are answered from the database (a sign-in reads the users).
    expect((await fetch(`${started.url}/readyz`)).status).toBe(200);
    const login = await fetch(`${started.url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        query: `mutation { login(email: "admin@example.com", password: "correct-horse-battery") { __typename } }`,
      }),
    });
    expect(await login.json()).toEqual({ data: { login: { __typename: 'LoginPayload' } } });
    // The order of two events, not a speed: the postmaster is spawned before the server's modules are evaluated
    // (main.ts), where it used to wait behind all of them (the start phases' `modules` ends when they are done).
    const logged = started.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const spawned = logged.find((l) => l.msg === 'spawned the embedded PostgreSQL')?.sinceProcessStartMs;
    const modules = logged.find((l) => l.msg === 'start phases (ms)')?.modules;
    expect(typeof spawned, 'no "spawned" line').toBe('number');
    expect(spawned as number).toBeLessThan(modules as number);
    await stopLast();
  }, 120_000);

  it('migrates an empty database, answers /readyz and GraphQL, and loads its tracing when asked', async () => {
    // A collector that only counts exports: tracing lives in a bundle of its own (dist/telemetry.js).
    const exports: string[] = [];
    const collector = http.createServer((req, res) => {
      exports.push(`${req.method} ${req.url}`);
      req.resume();
      req.on('end', () => res.end('{}'));
    });
    await new Promise<void>((r) => collector.listen(0, '127.0.0.1', r));
    const started = await start('dist/main.js', {
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${(collector.address() as AddressInfo).port}`,
      DATABASE_URL: dbUrl,
      HANGAR_DATA_DIR: dataDir,
      PORT: '0',
      HANGAR_LOG_LEVEL: 'info',
      HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
    });
    expect(started.stderr).not.toMatch(/"level":"(error|warn)"/);
    expect(started.url, `the bundle did not start: exit ${started.code}`).toBeDefined();
    const ready = await fetch(`${started.url}/readyz`);
    expect(ready.status).toBe(200);
    const answer = await fetch(`${started.url}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ query: '{ __typename }' }),
    });
    expect(await answer.json()).toEqual({ data: { __typename: 'Query' } });
    const child = children.at(-1) as ChildProcess;
    const ended = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await ended;
    await new Promise((r) => collector.close(r));
    expect(exports).toContain('POST /v1/traces');
  }, 60_000);
});
