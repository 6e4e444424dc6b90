import { type ChildProcess, fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import inspector from 'node:inspector/promises';
import os from 'node:os';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import { newEngineKey } from '@hangar/agent/control-plane';
import { createLogger } from '@hangar/common/log';
import { createApp } from '../src/app.js';
import { systemActor } from '../src/auth/actor.js';
import { hashSecret } from '../src/auth/secrets.js';
import { loadConfig } from '../src/config.js';
import { benchToken } from './api-token.js';
import type { Job, LatencyResult, StreamResult, Target } from './gateway-client.js';

// What the gateway costs an application. A stand-in OpenAI engine that answers at once (gateway-engine.ts) is
// called three ways by one client (gateway-client.ts: Node's http with a keep-alive agent per origin, the same
// code for every way): directly; through a bare Node reverse proxy (gateway-floor.ts: the least one more Node hop
// costs); and through a real Hangar (createApp, PostgreSQL, a caller token, a catalog model whose READY replica
// is the stand-in). Each in a process of its own, so that one's CPU and memory are not billed to another.
// Side by side, interleaved (which way goes first rotates):
//   1. added latency of sequential non-streaming requests, round by round: gateway − direct (goal ≤ 0.5 ms at
//      p50; for reference Bifrost publishes 0.62 ms of overhead, LiteLLM 3.25 ms);
//   2. chunks per second of 64 concurrent streams, through the gateway against direct (goal ≥ 0.9×);
//   3. the server's memory with 1000 streams held open through it, against the same server idle.
//   4. within 1, a second caller with three limits applying to every request (none refusing), against the first:
//      what checking limits adds (goal ≤ 0.05 ms at p50, #28).
// Absolute numbers move with the machine, and on a small one the client, the engine and the proxy share its
// cores: the floor says how much of a gap is the hop itself, and Hangar's CPU time per request and per chunk
// what the gateway spends whatever the machine.
//
// `tsx bench/gateway.ts [rounds] [stream rounds]`: sequential rounds (default 4000), streaming rounds (default 5).
// HANGAR_BENCH_PROFILE=<dir> writes Hangar's CPU profiles of the sequential and of the streaming runs there
// (latency.cpuprofile, streaming.cpuprofile: open them in Chrome's DevTools), to see where a missed goal goes.

const ROUNDS = Number(process.argv[2] ?? 4000);
const STREAM_ROUNDS = Number(process.argv[3] ?? 5);
const STREAMS = 64;
const STREAM_TOKENS = 256;
const ROUND_MS = 2000;
const OPEN_STREAMS = 1000;
const LATENCY_GOAL_MS = 0.5;
/** What three limits applying to every request may add at p50 (#28). */
const LIMITS_GOAL_MS = 0.05;
const STREAM_GOAL = 0.9;
const MiB = 1024 * 1024;
const PROFILE_DIR = process.env.HANGAR_BENCH_PROFILE;

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.join(os.tmpdir(), `hangar-bench-gateway-${process.pid}`);
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

const engineKey = newEngineKey();
const engine = start('gateway-engine.ts', { HANGAR_BENCH_ENGINE_KEY: engineKey });
const client = start('gateway-client.ts');
const { endpoint } = (await engine.first) as { endpoint: string };
const floor = start('gateway-floor.ts', { HANGAR_BENCH_ENGINE: endpoint, HANGAR_BENCH_ENGINE_KEY: engineKey });
await client.first;
const { url: floorUrl } = (await floor.first) as { url: string };

const config = loadConfig({
  HANGAR_DATA_DIR: root,
  PORT: '0',
  HANGAR_LOG_LEVEL: 'warn',
  HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
  // The 1000 open streams, and the client's keep-alive sockets besides, all from one address (loopback) and one
  // caller: the shares that keep one client from starving the rest would cut them at 512.
  HANGAR_MAX_CONNECTIONS: '4096',
  HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '4096',
  HANGAR_MAX_CONNECTIONS_PER_CALLER: '4096',
});
const app = await createApp({ config, log: createLogger('warn'), print: () => {} });
const hangar = await app.start();
const db = app.db.prisma;

// A caller token made the way an operator makes one for an application.
const token = await benchToken(hangar, { callerOnly: true });

// The fleet as an agent would have reported it: a node that is online (kept so below: placement counts a node
// silent for 30 s as gone, and its replica lost), a model, and its READY replica serving on the stand-in.
const node = await db.node.create({
  data: {
    name: 'bench-node',
    tokenHash: hashSecret(randomBytes(16).toString('hex')),
    lastSeenAt: new Date(),
    engines: [{ name: 'llama.cpp', version: 'bench', build: 9999 }],
  },
});
const heartbeat = setInterval(
  () => void db.node.update({ where: { id: node.id }, data: { lastSeenAt: new Date() } }).catch(() => {}),
  5000,
);
const model = await db.catalogModel.create({
  data: { name: 'bench', source: 'bench/stand-in', engine: 'llamacpp', minReplicas: 1, maxReplicas: 1 },
});
const replica = await db.replica.create({
  data: { modelId: model.id, nodeId: node.id, state: 'READY', endpoint, engineKey: { create: { key: engineKey } } },
});
await app.services.gateway.routes.refresh();

// The same kind of caller with three limits that apply to every request and never refuse one: its key's, its
// key's on this model, and its org's (#28). What checking them costs is this caller's latency less the other's.
const limitedToken = await benchToken(hangar, { callerOnly: true });
const limitedId = (await db.apiToken.findFirst({ orderBy: { createdAt: 'desc' }, select: { id: true } }))?.id as string;
const org = await db.org.create({ data: { name: 'bench-org' } });
await db.membership.create({ data: { orgId: org.id, apiTokenId: limitedId } });
const benchActor = systemActor('bench');
for (const [scope, model, limit] of [
  [`key:${limitedId}`, null, { requestsPerMinute: 1_000_000_000 }],
  [`key:${limitedId}`, 'bench', { tokensPerMinute: 1_000_000_000 }],
  ['org:bench-org', null, { tokensPerDay: 1_000_000_000_000 }],
] as const) {
  const set = await app.services.limits.setLimit(benchActor, { scope, model, limit });
  if (!set.ok) throw new Error(`bench: setLimit ${scope}: ${set.error.message}`);
}

const direct: Target = { url: endpoint, key: engineKey };
const bare: Target = { url: floorUrl, key: 'unused: the floor sends the engine key' };
const gateway: Target = { url: `${hangar}/v1`, key: token };
const limitedGateway: Target = { url: `${hangar}/v1`, key: limitedToken };

type Usage = { rss: number; heap: number; cpuMs: number };
/** Hangar's process: memory after a full GC, CPU time so far. */
const hangarUsage = (): Usage => {
  gc();
  const { rss, heapUsed } = process.memoryUsage();
  const cpu = process.cpuUsage();
  return { rss, heap: heapUsed, cpuMs: (cpu.user + cpu.system) / 1000 };
};
const floorUsage = () => ask<Usage>(floor.child, { count: 'usage' });
const engineHolds = async () => (await ask<{ held: number }>(engine.child, { count: 'held' })).held;

const at = (xs: number[], q: number) => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0;
};
const median = (xs: number[]) => at(xs, 0.5);
const until = async (what: string, ok: () => Promise<boolean> | boolean, ms = 30_000) => {
  const deadline = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > deadline) {
      throw new Error(
        `${what} did not happen within ${ms} ms (the engine holds ${await engineHolds()} streams, the gateway has ${app.services.gateway.load(replica.id).inFlight} in flight)`,
      );
    }
    await new Promise((r) => setTimeout(r, 20));
  }
};
/** Runs `fn` under V8's CPU profiler when HANGAR_BENCH_PROFILE is set, writing <name>.cpuprofile. */
const profiled = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
  if (!PROFILE_DIR) return fn();
  const session = new inspector.Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 100 });
  await session.post('Profiler.start');
  try {
    return await fn();
  } finally {
    const { profile } = await session.post('Profiler.stop');
    await fs.mkdir(PROFILE_DIR, { recursive: true });
    await fs.writeFile(path.join(PROFILE_DIR, `${name}.cpuprofile`), JSON.stringify(profile));
    session.disconnect();
  }
};

/** Memory of the proxy's process idle, then with OPEN_STREAMS streams held open through it. */
async function openStreams(target: Target, usage: () => Promise<Usage> | Usage) {
  await until('the streams before settling', async () => (await engineHolds()) === 0);
  const idle = await usage();
  await ask(client.child, { kind: 'hold', target, streams: OPEN_STREAMS } satisfies Job);
  await until(`${OPEN_STREAMS} streams held by the engine`, async () => (await engineHolds()) === OPEN_STREAMS);
  const inFlight = app.services.gateway.load(replica.id).inFlight;
  const open = await usage();
  await ask(client.child, { kind: 'release' } satisfies Job);
  // A client that went away aborts the engine's side at once: nothing stays held, nothing in flight.
  await until(
    'the held streams closing',
    async () => (await engineHolds()) === 0 && app.services.gateway.load(replica.id).inFlight === 0,
  );
  const closed = await usage();
  return { idle, open, closed, inFlight };
}

try {
  // Warm up: JIT, every keep-alive pool, the caller cache, the upstream agents.
  await ask<LatencyResult>(client.child, {
    kind: 'latency',
    targets: [direct, bare, gateway, limitedGateway],
    rounds: 500,
  });
  for (const target of [direct, bare, gateway]) {
    await ask<StreamResult>(client.child, { kind: 'stream', target, streams: STREAMS, tokens: 64, ms: 300 });
  }

  // 3. Memory, first: while the heap is still near an idle server's.
  const floorMemory = await openStreams(bare, floorUsage);
  const memory = await openStreams(gateway, hangarUsage);

  // What Hangar spends with no request at all (its loops: the route table's refresh, placement, usage, …),
  // taken out of its CPU per request below.
  const idleFrom = hangarUsage();
  const idleStarted = performance.now();
  await new Promise((r) => setTimeout(r, 3000));
  const idleCpuPerMs = (hangarUsage().cpuMs - idleFrom.cpuMs) / (performance.now() - idleStarted);

  // 1. Sequential requests, one after another, the three ways in turn.
  const floorCpu = await floorUsage();
  const cpu = hangarUsage();
  const latencyStarted = performance.now();
  const [latDirect = [], latBare = [], latGateway = [], latLimited = []] = await profiled('latency', () =>
    ask<LatencyResult>(client.child, {
      kind: 'latency',
      targets: [direct, bare, gateway, limitedGateway],
      rounds: ROUNDS,
    }),
  );
  const latencyMs = performance.now() - latencyStarted;
  const cpuPerRequest = (hangarUsage().cpuMs - cpu.cpuMs - idleCpuPerMs * latencyMs) / ROUNDS;
  const floorCpuPerRequest = ((await floorUsage()).cpuMs - floorCpu.cpuMs) / ROUNDS;
  const added = latGateway.map((g, i) => g - (latDirect[i] ?? 0));
  const addedFloor = latBare.map((b, i) => b - (latDirect[i] ?? 0));
  const limitsAdded = latLimited.map((l, i) => l - (latGateway[i] ?? 0));

  // 2. Streaming throughput, rounds rotating which way goes first.
  const ways = { direct, bare, gateway };
  const rates = { direct: [] as number[], bare: [] as number[], gateway: [] as number[] };
  const cpuPerChunkUs = { bare: [] as number[], gateway: [] as number[] };
  const names = Object.keys(ways) as (keyof typeof ways)[];
  await profiled('streaming', async () => {
    for (let round = 0; round < STREAM_ROUNDS; round++) {
      for (let k = 0; k < names.length; k++) {
        const way = names[(k + round) % names.length] as keyof typeof ways;
        const before = way === 'bare' ? (await floorUsage()).cpuMs : hangarUsage().cpuMs;
        const r = await ask<StreamResult>(client.child, {
          kind: 'stream',
          target: ways[way],
          streams: STREAMS,
          tokens: STREAM_TOKENS,
          ms: ROUND_MS,
        } satisfies Job);
        rates[way].push((r.events * 1000) / r.ms);
        if (way === 'bare') cpuPerChunkUs.bare.push((((await floorUsage()).cpuMs - before) * 1000) / r.events);
        if (way === 'gateway') cpuPerChunkUs.gateway.push(((hangarUsage().cpuMs - before) * 1000) / r.events);
      }
    }
  });

  const ms = (x: number) => `${x.toFixed(3)} ms`;
  const mib = (x: number) => `${(x / MiB).toFixed(1)} MiB`;
  const perStream = (x: number) => `${((x * 1024) / MiB / OPEN_STREAMS).toFixed(1)} KiB`;
  const addedP50 = median(added);
  const [directRate, bareRate, gatewayRate] = [median(rates.direct), median(rates.bare), median(rates.gateway)];
  const lines = [
    `gateway against its engine called directly and through a bare Node proxy (the floor): one client (Node's http, keep-alive agents), a stand-in engine answering at once, loopback, ${os.cpus().length} cores`,
    `  sequential non-streaming, ${ROUNDS} interleaved rounds: direct p50 ${ms(median(latDirect))} p99 ${ms(at(latDirect, 0.99))}; ` +
      `floor p50 ${ms(median(latBare))} p99 ${ms(at(latBare, 0.99))}; gateway p50 ${ms(median(latGateway))} p99 ${ms(at(latGateway, 0.99))}`,
    `    added by the gateway (round by round, gateway − direct): p50 ${ms(addedP50)} p99 ${ms(at(added, 0.99))}, ` +
      `${addedP50 <= LATENCY_GOAL_MS ? 'meets' : 'MISSES'} the goal ≤ ${LATENCY_GOAL_MS} ms (Bifrost publishes 0.62 ms, LiteLLM 3.25 ms); ` +
      `by the floor: p50 ${ms(median(addedFloor))} p99 ${ms(at(addedFloor, 0.99))}`,
    `    three limits on every request (key, key on the model, org), against the same caller with none: p50 ${ms(median(latLimited))} against ${ms(median(latGateway))}, ` +
      `added p50 ${ms(median(limitsAdded))} (round by round), ratio ${(median(latLimited) / median(latGateway)).toFixed(3)}×, ` +
      `${median(limitsAdded) <= LIMITS_GOAL_MS ? 'meets' : 'MISSES'} the goal ≤ ${LIMITS_GOAL_MS} ms`,
    `    CPU per request: Hangar ${ms(cpuPerRequest)} (beyond the ${(idleCpuPerMs * 1000).toFixed(0)} ms a second it spends idle), the floor ${ms(floorCpuPerRequest)} (${(cpuPerRequest / floorCpuPerRequest).toFixed(1)}×)`,
    `  ${STREAMS} concurrent streams of ${STREAM_TOKENS} tokens (${STREAM_ROUNDS} rounds of ${ROUND_MS / 1000} s, medians): direct ${directRate.toFixed(0)} chunks/s; ` +
      `floor ${bareRate.toFixed(0)} chunks/s (${(bareRate / directRate).toFixed(2)}×); gateway ${gatewayRate.toFixed(0)} chunks/s, ` +
      `ratio ${(gatewayRate / directRate).toFixed(2)}× ${gatewayRate / directRate >= STREAM_GOAL ? 'meets' : 'MISSES'} the goal ≥ ${STREAM_GOAL}× ` +
      `(${(gatewayRate / bareRate).toFixed(2)}× the floor)`,
    `    CPU per chunk: Hangar ${median(cpuPerChunkUs.gateway).toFixed(1)} µs, the floor ${median(cpuPerChunkUs.bare).toFixed(1)} µs`,
    `  ${OPEN_STREAMS} open streams through the gateway (${memory.inFlight} in flight): RSS ${mib(memory.open.rss)} against ${mib(memory.idle.rss)} idle ` +
      `(+${mib(memory.open.rss - memory.idle.rss)}, ${perStream(memory.open.rss - memory.idle.rss)} a stream), heap ${mib(memory.open.heap)} against ${mib(memory.idle.heap)} ` +
      `(+${mib(memory.open.heap - memory.idle.heap)}, ${perStream(memory.open.heap - memory.idle.heap)} a stream); once closed: RSS ${mib(memory.closed.rss)}, heap ${mib(memory.closed.heap)}`,
    `    the floor: RSS +${mib(floorMemory.open.rss - floorMemory.idle.rss)} (${perStream(floorMemory.open.rss - floorMemory.idle.rss)} a stream), ` +
      `heap +${mib(floorMemory.open.heap - floorMemory.idle.heap)} (${perStream(floorMemory.open.heap - floorMemory.idle.heap)} a stream)`,
  ];
  for (const line of lines) console.log(line);
} finally {
  clearInterval(heartbeat);
  for (const c of [client, floor, engine]) c.child.kill();
  await app.stop();
  await fs.rm(root, { recursive: true, force: true });
}
