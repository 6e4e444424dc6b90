import { type ChildProcess, fork, spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { newEngineKey } from '@hangar/agent/control-plane';
import type { Job, LatencyResult, StreamResult, Target, ThroughputResult } from './gateway-client.js';

// What the gateway costs an application, against the physical limit of a reverse proxy. A stand-in OpenAI engine
// that answers at once (gateway-engine.ts) is called by one client (gateway-client.ts: Node's http with a
// keep-alive agent per origin, the same code for every way) directly; through nginx as a reverse proxy (upstream
// keep-alive, the engine key set, no buffering: the least a proxy costs); through a bare Node reverse proxy
// (gateway-floor.ts: the least one more Node hop costs); and through a real Hangar in its own process, as deployed
// (gateway-hangar.ts: createApp, PostgreSQL, a caller token, a catalog model whose READY replica is the stand-in).
// Every one in a process of its own, so that one's CPU and memory are not billed to another. Interleaved (which
// way goes first rotates), medians:
//   1. added latency of sequential non-streaming requests, round by round: way − direct (goal: Hangar's p50 ≤ 3×
//      nginx's, #33); and a second caller with three limits on every request (none refusing): what checking
//      limits adds (goal ≤ 0.05 ms at p50, #28);
//   2. requests/s at 16 and 64 connections (goal: Hangar ≥ 0.5× direct at 16), and each proxy's CPU per request
//      (goal: Hangar ≤ 3× nginx's);
//   3. chunks/s of 64 concurrent streams and CPU per chunk (goal: Hangar ≤ 1.5× the bare Node proxy's);
//   4. memory with 1000 streams held open through Hangar and through the floor;
//   5. the route table at 1 and at 1,000 models each with an adapter: Hangar's idle CPU and added p99.
// CPU times are read from /proc (user + system, 10 ms ticks) for every proxy alike, over runs long enough for it.
// Absolute numbers move with the machine, and on a small one the client, the engine and the proxy share its
// cores (and other work may too: the load average is printed): the ratios side by side are what to read.
//
// `tsx bench/gateway.ts [rounds] [stream rounds]`: sequential rounds (default 3000), rounds of the rest (default 3).
// HANGAR_BENCH_PROFILE=<dir> writes Hangar's CPU profiles of the sequential and of the streaming runs there
// (latency.cpuprofile, streaming.cpuprofile: open them in Chrome's DevTools), to see where a missed goal goes; the
// profiler's sampling then inflates Hangar's CPU per chunk, so read that line from a run without it.
// HANGAR_BENCH_UNDICI=1 adds the floor over undici's Pool (request() and dispatch()) as two more ways.
// HANGAR_BENCH_WORKERS=<n>[,<m>…] adds Hangar with HANGAR_WORKERS=<n> (and <m>…) as more ways ("hangar-workers=n"):
// the real server (src/main.ts) as an operator starts it, on the same database and data dir as the Hangar above (so
// the same token and model), its CPU the primary's and every worker's. `1,2` compares one process and two started
// alike, interleaved. HANGAR_BENCH_ONLY=workers leaves out the memory and
// route-table lines (they are the one-process Hangar's), to compare the ways in less time.

const ROUNDS = Number(process.argv[2] ?? 3000);
const RATE_ROUNDS = Number(process.argv[3] ?? 3);
const STREAMS = 64;
const STREAM_TOKENS = 256;
const ROUND_MS = 2000;
const OPEN_STREAMS = 1000;
const MANY_MODELS = 1000;
const IDLE_MS = 5000;
/** Goals of #33 (against nginx and the floor) and #28 (limits). */
const NGINX_LATENCY_GOAL = 3;
const NGINX_CPU_GOAL = 3;
const DIRECT_RATE_GOAL = 0.5;
const FLOOR_CHUNK_GOAL = 1.5;
const LIMITS_GOAL_MS = 0.05;
const PROFILE_DIR = process.env.HANGAR_BENCH_PROFILE;
/** HANGAR_BENCH_ONLY=routes: the route table's line alone (5), for comparing its settings side by side. */
const ROUTES_ONLY = process.env.HANGAR_BENCH_ONLY === 'routes';
const WORKERS = (process.env.HANGAR_BENCH_WORKERS ?? '')
  .split(',')
  .filter(Boolean)
  .map(Number)
  .filter((n) => n >= 1);
const WORKERS_ONLY = process.env.HANGAR_BENCH_ONLY === 'workers';
const UNDICI = process.env.HANGAR_BENCH_UNDICI === '1';
const TICK_MS = 1000 / Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim() || 100);

const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.join(os.tmpdir(), `hangar-bench-gateway-nginx-${process.pid}`);
await fs.mkdir(root, { recursive: true, mode: 0o755 });

/** A bench process run with tsx, as this one is; `first` is its first message (it is listening). */
function start(file: string, env: Record<string, string> = {}) {
  const child = fork(path.join(here, file), [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const first = new Promise<unknown>((resolve, reject) => {
    child.once('message', resolve);
    child.once('exit', (code) => reject(new Error(`${file} exited (${code}) before it was ready`)));
  });
  return { child, first };
}

/** Sends one message and resolves with the child's answer (one question at a time per child). */
function ask<T>(child: ChildProcess, message: unknown): Promise<T> {
  return new Promise((resolve, reject) => {
    child.once('message', (m: { ok?: T; error?: string }) => {
      if (m.error) reject(new Error(m.error));
      else resolve((m.ok ?? m) as T);
    });
    child.send(message as object);
  });
}

/** A process's CPU time so far (user + system), in ms, from /proc. */
function cpuMs(pid: number): number {
  const { user, system } = cpuSplit(pid);
  return user + system;
}

/** Processes whose CPU is theirs and their children's: Hangar with HANGAR_WORKERS (its primary and workers). */
const withChildren = new Set<number>();

/** The same, apart: system time is mostly the sockets' syscalls, which every proxy makes alike. */
function cpuSplit(pid: number): { user: number; system: number } {
  const pids = withChildren.has(pid)
    ? [
        pid,
        ...readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number),
      ]
    : [pid];
  let user = 0;
  let system = 0;
  for (const p of pids) {
    const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    user += Number(fields[11]) * TICK_MS;
    system += Number(fields[12]) * TICK_MS;
  }
  return { user, system };
}

/**
 * Hangar with HANGAR_WORKERS=n, started as `pnpm start` starts the server (src/main.ts under tsx here, as the
 * one-process Hangar runs from the sources), on the one-process Hangar's database and data dir; resolves once it
 * says it is ready (every worker listens).
 */
async function startWorkers(n: number, databaseUrl: string, dataDir: string) {
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', path.join(here, '..', 'src', 'main.ts')], {
    cwd: path.join(here, '..'),
    env: {
      ...process.env,
      HANGAR_WORKERS: String(n),
      DATABASE_URL: databaseUrl,
      HANGAR_DATA_DIR: dataDir,
      PORT: String(port),
      HOST: '127.0.0.1',
      HANGAR_LOG_LEVEL: 'warn',
      HANGAR_HUB_URL: 'off',
      HANGAR_WEB_DIST: path.join(dataDir, 'no-web-dist'),
      // As the one-process Hangar's (gateway-hangar.ts): the whole server's shares, divided among the workers.
      HANGAR_MAX_CONNECTIONS: '4096',
      HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '4096',
      HANGAR_MAX_CONNECTIONS_PER_CALLER: '4096',
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  await new Promise<void>((resolve, reject) => {
    child.stdout?.on('data', (d) => {
      out += String(d);
      if (out.includes('Hangar is ready')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`Hangar with HANGAR_WORKERS=${n} exited (${code}): ${out}`)));
  });
  withChildren.add(child.pid as number);
  return { child, url: `http://127.0.0.1:${port}` };
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });

// ─── nginx as a reverse proxy, installed when missing (as bench/mirror.ts does) ─────────────────────────────────

function findNginx(): string | null {
  const found = spawnSync('sh', ['-c', 'command -v nginx || ls /usr/sbin/nginx'], { encoding: 'utf8' });
  return found.status === 0 ? found.stdout.trim().split('\n')[0] || null : null;
}

function installNginx(): string | null {
  const existing = findNginx();
  if (existing) return existing;
  if (process.getuid?.() !== 0 || spawnSync('sh', ['-c', 'command -v apt-get']).status !== 0) return null;
  console.log('nginx is missing: installing it with apt-get (once)…');
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const install = () =>
    spawnSync('apt-get', ['install', '-y', '-q', '--no-install-recommends', 'nginx'], { env, stdio: 'ignore' })
      .status === 0;
  if (!install()) {
    spawnSync('apt-get', ['update', '-q'], { env, stdio: 'ignore' });
    if (!install()) return null;
  }
  return findNginx();
}

/** nginx in front of the engine, one worker (as Hangar is one process), resolving with its URL and worker's pid. */
async function startNginx(bin: string, engine: string, key: string) {
  const dir = path.join(root, 'nginx');
  await fs.mkdir(dir, { recursive: true });
  const port = await freePort();
  const upstream = new URL(engine);
  const n = (p: string) => path.join(dir, p);
  await fs.writeFile(
    n('nginx.conf'),
    `daemon off;
worker_processes 1;
pid ${n('nginx.pid')};
error_log ${n('error.log')} warn;
events { worker_connections 8192; }
http {
  access_log ${n('access.log')};
  client_body_temp_path ${n('client_body')};
  proxy_temp_path ${n('proxy')};
  fastcgi_temp_path ${n('fastcgi')};
  uwsgi_temp_path ${n('uwsgi')};
  scgi_temp_path ${n('scgi')};
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  upstream engine { server ${upstream.host}; keepalive 512; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:${port};
    location /v1/ {
      proxy_pass http://engine/v1/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "Bearer ${key}";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
`,
  );
  const child = spawn(bin, ['-p', dir, '-e', n('error.log'), '-c', n('nginx.conf')], { stdio: 'ignore' });
  const url = `http://127.0.0.1:${port}/v1`;
  const deadline = Date.now() + 10_000;
  for (;;) {
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline) throw new Error(`nginx did not listen: ${await fs.readFile(n('error.log'), 'utf8')}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const children = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8').trim().split(/\s+/);
  const worker = Number(children[0]);
  const version = spawnSync(bin, ['-v'], { encoding: 'utf8' })
    .stderr.trim()
    .replace(/^nginx version: /, '');
  return { child, url, worker, version };
}

// ─── the ways ───────────────────────────────────────────────────────────────────────────────────────────────────

const engineKey = newEngineKey();
const engine = start('gateway-engine.ts', { HANGAR_BENCH_ENGINE_KEY: engineKey });
const client = start('gateway-client.ts');
const { endpoint } = (await engine.first) as { endpoint: string };
const floor = start('gateway-floor.ts', { HANGAR_BENCH_ENGINE: endpoint, HANGAR_BENCH_ENGINE_KEY: engineKey });
const hangar = start('gateway-hangar.ts', { HANGAR_BENCH_ENGINE: endpoint, HANGAR_BENCH_ENGINE_KEY: engineKey });
// HANGAR_BENCH_UNDICI=1: two more floors, the same bare proxy over undici's Pool (its request() and its dispatch()),
// to see which HTTP client costs the gateway less per request (#33).
const undiciFloors = UNDICI
  ? (['request', 'dispatch'] as const).map((api) =>
      start('gateway-floor-undici.ts', {
        HANGAR_BENCH_ENGINE: endpoint,
        HANGAR_BENCH_ENGINE_KEY: engineKey,
        HANGAR_BENCH_UNDICI_API: api,
      }),
    )
  : [];
await client.first;
const { url: floorUrl } = (await floor.first) as { url: string };
const undiciUrls = await Promise.all(undiciFloors.map(async (f) => ((await f.first) as { url: string }).url));
const hangarReady = (await hangar.first) as {
  url: string;
  token: string;
  limitedToken: string;
  databaseUrl: string;
  dataDir: string;
};
// One after the other: each migrates and sets up the database's triggers as it starts.
const workers: { n: number; child: ChildProcess; url: string }[] = [];
for (const n of WORKERS) workers.push({ n, ...(await startWorkers(n, hangarReady.databaseUrl, hangarReady.dataDir)) });
const nginxBin = installNginx();
if (!nginxBin) console.log('\n!!!!!!!! nginx could not be found or installed: its baseline is left out.\n');
const nginx = nginxBin ? await startNginx(nginxBin, endpoint, engineKey) : undefined;

const direct: Target = { url: endpoint, key: engineKey };
const bare: Target = { url: floorUrl, key: 'unused: the floor sends the engine key' };
const viaNginx: Target | undefined = nginx && { url: nginx.url, key: 'unused: nginx sends the engine key' };
const gateway: Target = { url: `${hangarReady.url}/v1`, key: hangarReady.token };
const limitedGateway: Target = { url: `${hangarReady.url}/v1`, key: hangarReady.limitedToken };

type Way = 'direct' | 'nginx' | 'floor' | 'hangar' | `hangar-workers=${number}` | 'undici' | 'undici-dispatch';
const ways: [Way, Target][] = [
  ['direct', direct],
  ...(viaNginx ? [['nginx', viaNginx] as [Way, Target]] : []),
  ['floor', bare],
  ...undiciUrls.map((url, i) => [i ? 'undici-dispatch' : 'undici', { url, key: 'unused' }] as [Way, Target]),
  ['hangar', gateway],
  ...workers.map((w) => [`hangar-workers=${w.n}`, { url: `${w.url}/v1`, key: hangarReady.token }] as [Way, Target]),
];
const pidOf: Record<Way, number | undefined> = {
  ...Object.fromEntries(workers.map((w) => [`hangar-workers=${w.n}`, w.child.pid])),
  direct: engine.child.pid,
  nginx: nginx?.worker,
  floor: floor.child.pid,
  hangar: hangar.child.pid,
  undici: undiciFloors[0]?.child.pid,
  'undici-dispatch': undiciFloors[1]?.child.pid,
};

type Memory = { rss: number; heap: number; cpuMs: number };
const hangarUsage = () => ask<Memory>(hangar.child, { count: 'usage' });
const floorUsage = () => ask<Memory>(floor.child, { count: 'usage' });
const engineHolds = async () => (await ask<{ held: number }>(engine.child, { count: 'held' })).held;
const hangarInFlight = () => ask<number>(hangar.child, { count: 'inFlight' });

const at = (xs: number[], q: number) => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0;
};
const median = (xs: number[]) => at(xs, 0.5);
/** The median and the spread (lowest–highest) of a few rounds. */
const spread = (xs: number[], f: (x: number) => string) =>
  `${f(median(xs))} (${f(Math.min(...xs))}–${f(Math.max(...xs))})`;
const until = async (what: string, ok: () => Promise<boolean>, ms = 30_000) => {
  const deadline = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
};
const profiled = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
  if (!PROFILE_DIR) return fn();
  await fs.mkdir(PROFILE_DIR, { recursive: true });
  await ask(hangar.child, { profile: 'start' });
  try {
    return await fn();
  } finally {
    await ask(hangar.child, { profile: 'stop', file: path.join(PROFILE_DIR, `${name}.cpuprofile`) });
  }
};

/** Memory of the proxy's process idle, then with OPEN_STREAMS streams held open through it. */
async function openStreams(target: Target, usage: () => Promise<Memory>) {
  await until('the streams before settling', async () => (await engineHolds()) === 0);
  const idle = await usage();
  await ask(client.child, { kind: 'hold', target, streams: OPEN_STREAMS } satisfies Job);
  await until(`${OPEN_STREAMS} streams held by the engine`, async () => (await engineHolds()) === OPEN_STREAMS);
  const open = await usage();
  await ask(client.child, { kind: 'release' } satisfies Job);
  // A client that went away aborts the engine's side at once: nothing stays held, nothing in flight.
  await until('the held streams closing', async () => (await engineHolds()) === 0 && (await hangarInFlight()) === 0);
  return { idle, open };
}

/** Hangar's CPU over IDLE_MS with no request: its loops (the route table, placement, usage, …). */
async function idleCpu(): Promise<number> {
  const from = cpuMs(pidOf.hangar as number);
  const started = performance.now();
  await new Promise((r) => setTimeout(r, IDLE_MS));
  return ((cpuMs(pidOf.hangar as number) - from) * 1000) / (performance.now() - started);
}

/** Sequential rounds, every way in turn; added latency per way, round by round against direct. */
async function sequential(rounds: number, withLimited: boolean) {
  const targets = [...ways.map(([, t]) => t), ...(withLimited ? [limitedGateway] : [])];
  const lat = await ask<LatencyResult>(client.child, { kind: 'latency', targets, rounds });
  const byWay = new Map<Way | 'limited', number[]>();
  for (const [i, [w]] of ways.entries()) byWay.set(w, lat[i] ?? []);
  if (withLimited) byWay.set('limited', lat[ways.length] ?? []);
  const d = byWay.get('direct') ?? [];
  const added = (w: Way | 'limited') => (byWay.get(w) ?? []).map((x, i) => x - (d[i] ?? 0));
  return { byWay, added };
}

const ms = (x: number) => `${x.toFixed(3)} ms`;
const mib = (x: number) => `${(x / 1024 / 1024).toFixed(1)} MiB`;
const lines: string[] = [];
const say = (line: string) => {
  lines.push(line);
  console.log(line);
};

try {
  // Warm up: JIT, every keep-alive pool, the caller cache, the upstream agents.
  await sequential(500, true);
  for (const [, target] of ways) {
    await ask<StreamResult>(client.child, { kind: 'stream', target, streams: STREAMS, tokens: 64, ms: 300 });
    await ask<ThroughputResult>(client.child, { kind: 'throughput', target, connections: 16, ms: 300 });
  }
  const load = () =>
    os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(' ');
  say(
    `gateway against its engine called directly, through ${nginx ? nginx.version : '(no nginx)'} and through a bare Node proxy (the floor): one client (Node's http, keep-alive agents), a stand-in engine answering at once, loopback, ${os.cpus().length} cores, load average ${load()} at the start`,
  );

  // 5a. Idle, with one model (first: nothing has run through it yet but the warm-up).
  const idleOne = await idleCpu();
  if (!ROUTES_ONLY) {
    // 4. Memory, first: while the heap is still near an idle server's.
    const floorMemory = WORKERS_ONLY ? undefined : await openStreams(bare, floorUsage);
    const memory = WORKERS_ONLY ? undefined : await openStreams(gateway, hangarUsage);

    // 1. Sequential requests.
    const seq = await profiled('latency', () => sequential(ROUNDS, true));
    const addedP50 = (w: Way) => median(seq.added(w));
    for (const [w] of ways.slice(1)) {
      const x = seq.byWay.get(w) ?? [];
      say(
        `  sequential, ${ROUNDS} interleaved rounds: ${w} p50 ${ms(median(x))} p99 ${ms(at(x, 0.99))}, added p50 ${ms(addedP50(w))} p99 ${ms(at(seq.added(w), 0.99))}`,
      );
    }
    const d = seq.byWay.get('direct') ?? [];
    say(`    direct p50 ${ms(median(d))} p99 ${ms(at(d, 0.99))}`);
    if (nginx) {
      const r = addedP50('hangar') / addedP50('nginx');
      say(
        `    Hangar's added p50 is ${r.toFixed(1)}× nginx's, ${r <= NGINX_LATENCY_GOAL ? 'meets' : 'MISSES'} the goal ≤ ${NGINX_LATENCY_GOAL}×; ${(addedP50('hangar') / addedP50('floor')).toFixed(1)}× the floor's`,
      );
    }
    const limitsAdded = (seq.byWay.get('limited') ?? []).map((l, i) => l - (seq.byWay.get('hangar')?.[i] ?? 0));
    say(
      `    three limits on every request (key, key on the model, org), against the same caller with none: added p50 ${ms(median(limitsAdded))} (round by round), ` +
        `${median(limitsAdded) <= LIMITS_GOAL_MS ? 'meets' : 'MISSES'} the goal ≤ ${LIMITS_GOAL_MS} ms`,
    );

    // 2. Requests per second at 16 and 64 connections, and CPU per request; 3. streams. Rounds rotate the order.
    const rates: Record<string, number[]> = {};
    const cpuPerRequest: Record<string, number[]> = {};
    const systemPerRequest: Record<string, number[]> = {};
    const chunks: Record<string, number[]> = {};
    const cpuPerChunk: Record<string, number[]> = {};
    const push = (o: Record<string, number[]>, k: string, v: number) => {
      o[k] ??= [];
      o[k].push(v);
    };
    for (let round = 0; round < RATE_ROUNDS; round++) {
      for (let k = 0; k < ways.length; k++) {
        const [way, target] = ways[(k + round) % ways.length] as [Way, Target];
        const pid = pidOf[way] as number;
        for (const connections of [16, 64]) {
          const before = cpuSplit(pid);
          const r = await ask<ThroughputResult>(client.child, {
            kind: 'throughput',
            target,
            connections,
            ms: ROUND_MS,
          });
          push(rates, `${way} ${connections}`, (r.requests * 1000) / r.ms);
          push(rates, `${way} ${connections} p50`, r.p50);
          if (connections === 16 && way !== 'direct') {
            const after = cpuSplit(pid);
            const user = after.user - before.user;
            const system = after.system - before.system;
            push(cpuPerRequest, way, (user + system) / r.requests);
            push(systemPerRequest, way, system / r.requests);
          }
        }
      }
    }
    await profiled('streaming', async () => {
      for (let round = 0; round < RATE_ROUNDS; round++) {
        for (let k = 0; k < ways.length; k++) {
          const [way, target] = ways[(k + round) % ways.length] as [Way, Target];
          const pid = pidOf[way] as number;
          const before = cpuMs(pid);
          const r = await ask<StreamResult>(client.child, {
            kind: 'stream',
            target,
            streams: STREAMS,
            tokens: STREAM_TOKENS,
            ms: ROUND_MS,
          } satisfies Job);
          push(chunks, way, (r.events * 1000) / r.ms);
          if (way !== 'direct') push(cpuPerChunk, way, ((cpuMs(pid) - before) * 1000) / r.events);
        }
      }
    });
    const rps = (x: number) => `${(x / 1000).toFixed(2)}k/s`;
    for (const connections of [16, 64]) {
      const directRate = median(rates[`direct ${connections}`] ?? []);
      say(
        `  ${connections} connections, non-streaming (${RATE_ROUNDS} rounds of ${ROUND_MS / 1000} s, medians (lowest–highest)): ` +
          ways
            .map(
              ([w]) =>
                `${w} ${spread(rates[`${w} ${connections}`] ?? [], rps)}${w === 'direct' ? '' : ` = ${(median(rates[`${w} ${connections}`] ?? []) / directRate).toFixed(2)}×`} p50 ${ms(median(rates[`${w} ${connections} p50`] ?? []))}`,
            )
            .join('; '),
      );
    }
    const hangarAt16 = median(rates['hangar 16'] ?? []) / median(rates['direct 16'] ?? []);
    say(
      `    Hangar at 16 connections: ${hangarAt16.toFixed(2)}× direct, ${hangarAt16 >= DIRECT_RATE_GOAL ? 'meets' : 'MISSES'} the goal ≥ ${DIRECT_RATE_GOAL}×`,
    );
    for (const w of workers) {
      for (const connections of [16, 64]) {
        const d = median(rates[`direct ${connections}`] ?? []);
        const one = median(rates[`hangar ${connections}`] ?? []);
        const many = median(rates[`hangar-workers=${w.n} ${connections}`] ?? []);
        say(
          `    HANGAR_WORKERS=${w.n} at ${connections} connections: ${(many / d).toFixed(2)}× direct (Hangar in the bench's process: ${(one / d).toFixed(2)}×), ${(many / one).toFixed(2)}× that` +
            (connections === 16
              ? `, ${many / d >= DIRECT_RATE_GOAL ? 'meets' : 'MISSES'} the goal ≥ ${DIRECT_RATE_GOAL}×`
              : ''),
        );
      }
    }
    const cpu = (w: string) => median(cpuPerRequest[w] ?? []);
    say(
      `  CPU per request (at 16 connections, from /proc): ${ways
        .slice(1)
        .map(
          ([w]) =>
            `${w} ${spread(cpuPerRequest[w] ?? [], (x) => `${(x * 1000).toFixed(0)} µs`)} (system ${(median(systemPerRequest[w] ?? []) * 1000).toFixed(0)} µs)`,
        )
        .join('; ')}` +
        (nginx
          ? `; Hangar ${(cpu('hangar') / cpu('nginx')).toFixed(1)}× nginx, ${cpu('hangar') / cpu('nginx') <= NGINX_CPU_GOAL ? 'meets' : 'MISSES'} the goal ≤ ${NGINX_CPU_GOAL}×; ${(cpu('hangar') / cpu('floor')).toFixed(1)}× the floor`
          : ''),
    );
    const directChunks = median(chunks.direct ?? []);
    say(
      `  ${STREAMS} concurrent streams of ${STREAM_TOKENS} tokens, chunks/s: ${ways
        .map(
          ([w]) =>
            `${w} ${spread(chunks[w] ?? [], (x) => x.toFixed(0))} (${(median(chunks[w] ?? []) / directChunks).toFixed(2)}×)`,
        )
        .join('; ')}`,
    );
    const chunkCpu = (w: string) => median(cpuPerChunk[w] ?? []);
    say(
      `    CPU per chunk: ${ways
        .slice(1)
        .map(([w]) => `${w} ${spread(cpuPerChunk[w] ?? [], (x) => `${x.toFixed(1)} µs`)}`)
        .join('; ')}; Hangar ${(chunkCpu('hangar') / chunkCpu('floor')).toFixed(2)}× the floor, ` +
        `${chunkCpu('hangar') / chunkCpu('floor') <= FLOOR_CHUNK_GOAL ? 'meets' : 'MISSES'} the goal ≤ ${FLOOR_CHUNK_GOAL}×`,
    );
    const perStream = (x: number) => `${(x / 1024 / OPEN_STREAMS).toFixed(1)} KiB`;
    if (memory && floorMemory)
      say(
        `  ${OPEN_STREAMS} open streams: Hangar RSS +${mib(memory.open.rss - memory.idle.rss)} (${perStream(memory.open.rss - memory.idle.rss)} a stream), heap +${mib(memory.open.heap - memory.idle.heap)}; ` +
          `the floor RSS +${mib(floorMemory.open.rss - floorMemory.idle.rss)} (${perStream(floorMemory.open.rss - floorMemory.idle.rss)} a stream), heap +${mib(floorMemory.open.heap - floorMemory.idle.heap)}`,
      );
  }
  // The one-process Hangar's alone: left out with HANGAR_BENCH_ONLY=workers.
  if (!WORKERS_ONLY) {
    // 5b. The same Hangar with 1,000 models, each with an adapter and a READY replica.
    const seqOne = await sequential(Math.min(ROUNDS, 2000), false);
    const total = await ask<number>(hangar.child, { models: MANY_MODELS - 1 });
    // The models' events, and the passes they set off (placement, the route table's read of them), settle first.
    await new Promise((r) => setTimeout(r, 5000));
    const idleMany = await profiled('idle-1000-models', idleCpu);
    const seqMany = await sequential(Math.min(ROUNDS, 2000), false);
    say(
      `  route table: 1 model: idle CPU ${idleOne.toFixed(1)} ms/s, added p50 ${ms(median(seqOne.added('hangar')))} p99 ${ms(at(seqOne.added('hangar'), 0.99))}; ` +
        `${total} models + ${total - 1} adapters: idle CPU ${idleMany.toFixed(1)} ms/s, added p50 ${ms(median(seqMany.added('hangar')))} p99 ${ms(at(seqMany.added('hangar'), 0.99))}`,
    );
  }
  say(`  load average at the end: ${load()}`);
} finally {
  // First the workers, which use the one-process Hangar's PostgreSQL: SIGTERM, as an operator stops them.
  for (const w of workers) {
    if (w.child.exitCode !== null) continue;
    const ended = new Promise((r) => w.child.once('exit', r));
    w.child.kill('SIGTERM');
    await Promise.race([ended, new Promise((r) => setTimeout(r, 30_000))]);
  }
  // Hangar stops on its own when its channel closes (its PostgreSQL with it); the others are killed.
  const stopped = new Promise((r) => hangar.child.once('exit', r));
  hangar.child.disconnect();
  await Promise.race([stopped, new Promise((r) => setTimeout(r, 20_000))]);
  for (const c of [client, floor, engine, ...undiciFloors]) c.child.kill();
  nginx?.child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 500));
  await fs.rm(root, { recursive: true, force: true });
}
