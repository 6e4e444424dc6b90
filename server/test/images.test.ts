import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import YAML from 'yaml';
import { buildServer } from '../scripts/build.mjs';

// The images, as far as they can be built without a Docker daemon or a registry (neither is reachable here or
// in CI): every file the Dockerfiles copy exists, the final stages run as a user that is not root, compose's
// settings are names the server reads, and the server image's final stage, laid out on this machine exactly as
// its COPY lines say (from a real `pnpm build`), starts on a PostgreSQL of its own and answers /readyz. What
// this cannot run: the base images' own steps (apt, npm install of the CUDA prebuilt) and a GPU.

const repo = fileURLToPath(new URL('../..', import.meta.url));
const read = (file: string) => fs.readFile(path.join(repo, file), 'utf8');

type Stage = { name: string; lines: string[] };
/** A Dockerfile's stages with their instructions, continuation lines joined, comments left out. */
function stages(text: string): Stage[] {
  const out: Stage[] = [];
  const joined = text.replace(/\\\n/g, ' ').split('\n');
  for (const line of joined.map((l) => l.trim()).filter((l) => l && !l.startsWith('#'))) {
    const from = /^FROM\s+\S+(?:\s+AS\s+(\S+))?/i.exec(line);
    if (from) out.push({ name: from[1] ?? '', lines: [] });
    else out.at(-1)?.lines.push(line);
  }
  return out;
}

/** COPY lines as [from-stage or undefined, sources, destination]. */
function copies(stage: Stage) {
  return stage.lines
    .filter((l) => l.startsWith('COPY '))
    .map((l) => {
      const words = l.split(/\s+/).slice(1);
      const from = words.find((w) => w.startsWith('--from='))?.slice('--from='.length);
      const rest = words.filter((w) => !w.startsWith('--'));
      return { from, sources: rest.slice(0, -1), dest: rest.at(-1) as string };
    });
}

describe.each(['Dockerfile', 'Dockerfile.agent'])('%s', (file) => {
  it('copies only what the repository has or the build stage makes, and ends as a user that is not root', async () => {
    const all = stages(await read(file));
    const build = all.find((s) => s.name === 'build') as Stage;
    const installs = build.lines.filter((l) => l.startsWith('RUN pnpm install') || l.includes('&& pnpm install'));
    expect(installs[0]).toMatch(/^RUN pnpm install --frozen-lockfile\b/);
    if (file === 'Dockerfile.agent') {
      // A GPU node's image installs the agent's package and its workspace dependencies alone: none of the
      // server's (PostgreSQL, Prisma, Yoga), which packages/agent/test/imports.test.ts proves it does not need.
      for (const line of installs) expect(line).toMatch(/--filter @hangar\/agent\b/);
      for (const c of copies(build)) expect(c.sources.filter((s) => /^(server|web|e2e)\//.test(s))).toEqual([]);
    }
    for (const c of copies(build)) {
      for (const src of c.sources) {
        if (src === '.') continue;
        expect(existsSync(path.join(repo, src)), `${file}: COPY ${src} is not in the repository`).toBe(true);
      }
    }
    const last = all.at(-1) as Stage;
    const users = last.lines.filter((l) => l.startsWith('USER '));
    expect(users.length, `${file}: the final stage sets no USER`).toBeGreaterThan(0);
    expect(users.at(-1)).not.toMatch(/^USER\s+(root|0)(:|$)/);
    // Nothing runs as root after the switch.
    const afterUser = last.lines.slice(last.lines.lastIndexOf(users.at(-1) as string));
    expect(afterUser.filter((l) => l.startsWith('RUN '))).toEqual([]);
  });
});

describe('compose.yaml', () => {
  it("sets only settings the server reads, and points it at compose's PostgreSQL", async () => {
    const compose = YAML.parse(await read('compose.yaml')) as {
      services: Record<string, { environment?: Record<string, string>; build?: string }>;
    };
    const config = await read('server/src/config.ts');
    const hangar = compose.services.hangar;
    expect(hangar?.build).toBe('.');
    const names = Object.keys(hangar?.environment ?? {});
    expect(names).toContain('DATABASE_URL');
    for (const name of names) {
      expect(config, `compose sets ${name}, which server/src/config.ts does not read`).toMatch(
        new RegExp(`\\b${name}\\b`),
      );
    }
    expect(hangar?.environment?.DATABASE_URL).toMatch(/@postgres:5432\//);
    expect(compose.services.postgres).toBeTruthy();
  });
});

describe("the server image's final stage, laid out here", () => {
  const children: ChildProcess[] = [];
  const dbName = `hangar_test_${randomBytes(5).toString('hex')}`;
  const admin = () => inject('pgAdminUrl');
  let app: string;
  let dataDir: string;

  const sql = async (text: string) => {
    const client = new pg.Client({ connectionString: admin() });
    await client.connect();
    await client.query(text);
    await client.end();
  };

  beforeAll(async () => {
    await buildServer();
    await sql(`CREATE DATABASE ${dbName}`);
    const root = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-image-'));
    app = path.join(root, 'app');
    dataDir = path.join(root, 'data');
    await fs.mkdir(dataDir, { recursive: true });
    const server = stages(await read('Dockerfile')).find((s) => s.name === 'server') as Stage;
    for (const c of copies(server)) {
      expect(c.from).toBe('build');
      for (const src of c.sources) {
        const from = path.join(repo, src.replace(/^\/src\//, ''));
        const to = path.join(app, c.dest);
        // The console may not be built in this checkout (the browser tests build it); an empty one stands in.
        if (src === '/src/web/dist' && !existsSync(from)) {
          await fs.mkdir(to, { recursive: true });
          continue;
        }
        expect(existsSync(from), `the build stage makes no ${src}`).toBe(true);
        await fs.mkdir(path.dirname(to), { recursive: true });
        // Installs are linked, not copied: pnpm's links resolve the same either way, and they are large.
        if (src.endsWith('node_modules')) await fs.symlink(from, to);
        else await fs.cp(from, to, { recursive: true });
      }
    }
  }, 60_000);

  afterAll(async () => {
    for (const child of children) {
      if (child.exitCode !== null) continue;
      const ended = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await ended;
    }
    await sql(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    await fs.rm(path.dirname(app), { recursive: true, force: true });
  });

  it('has no sources, runs the bundle through its ENTRYPOINT and answers /readyz', async () => {
    expect(existsSync(path.join(app, 'server/src/main.ts'))).toBe(false);
    const url = new URL(admin());
    url.pathname = `/${dbName}`;
    const child = spawn(process.execPath, ['server/bin/hangar.mjs', 'server'], {
      cwd: app,
      env: {
        PATH: process.env.PATH ?? '',
        DATABASE_URL: url.toString(),
        HANGAR_DATA_DIR: dataDir,
        HOST: '127.0.0.1',
        PORT: '0',
        HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
        NODE_ENV: 'production',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    children.push(child);
    let log = '';
    const lines = readline.createInterface({ input: child.stderr as NodeJS.ReadableStream });
    const listening = await new Promise<string | undefined>((resolve) => {
      lines.on('line', (line) => {
        log += `${line}\n`;
        if (line.includes('"Hangar is listening"')) resolve((JSON.parse(line) as { url: string }).url);
      });
      child.on('exit', () => resolve(undefined));
    });
    expect(listening, `the image's server did not start:\n${log}`).toBeDefined();
    expect((await fetch(`${listening}/readyz`)).status).toBe(200);
  }, 60_000);
});
