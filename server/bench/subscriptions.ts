import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { freePort } from '@hangar/common/free-port';
import { type Client, createClient } from 'graphql-ws';
import pg from 'pg';
import WebSocket from 'ws';
import { buildServer } from '../scripts/build.mjs';
import { checkServerBuild } from '../scripts/server-stamp.mjs';
import { benchToken } from './api-token.js';

// An event's delay at 1000 subscribers: from the moment it is sent (the mirror's NOTIFY for Hangar, a publish
// for bare Yoga) to the moment each subscriber has it, over graphql-ws and over SSE, and each server's resident
// memory while it holds them. Bare graphql-yoga on Hangar's SDL, answering from a constant, is the baseline
// (bench/subscription-bare.mjs). Each side is a process of its own, run as it is deployed: plain JavaScript
// for the baseline, Hangar's own build (`node dist/main.js`, built first if it is not current) with its embedded
// PostgreSQL, so neither carries a TypeScript loader's compiled sources in its memory. The rounds are
// interleaved (bare, hangar, bare, hangar, …) and the median round is reported with the spread. Goals (#17):
// p99 ≤ 1.3× bare Yoga's, RSS ≤ 1.5×.
//
//   tsx bench/subscriptions.ts [subscribers] [rounds] [events per round] [another server/ directory, built]

const SUBSCRIBERS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const EVENTS = Number(process.argv[4] ?? 20);
const OTHER_SERVER = process.argv[5];
const QUERY = 'subscription { mirrorChanged { id state bytesDone bytesTotal percent usedBy { name } } }';
const here = path.dirname(fileURLToPath(import.meta.url));

type Side = {
  name: string;
  url: string;
  token: string;
  child: ChildProcess;
  /** Sends one event as that side's code would. */
  event: () => Promise<void>;
  /** Warnings the process printed (a MaxListenersExceededWarning would be one). */
  warnings: Set<string>;
  stop: () => Promise<void>;
};
type Transport = 'WebSocket' | 'SSE';
type Round = { p50: number; p99: number; rss: number; idleRss: number; warnings: string[] };

const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

// BENCH_CPU_PROF=<dir> writes each side's CPU profile there when it stops, to see where a fan-out's time goes.
const profile = () =>
  process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];

function spawnSide(args: string[], options: { cwd: string; env?: NodeJS.ProcessEnv }) {
  const child = spawn(process.execPath, [...profile(), ...args], { ...options, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  const warnings = new Set<string>();
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    stderr = (stderr + chunk).slice(-4000);
    for (const m of chunk.matchAll(/\(node:\d+\) (\w+Warning)/g)) warnings.add(m[1] as string);
  });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const stop = async () => {
    child.kill('SIGTERM');
    await exited;
  };
  return { child, warnings, stop, stderr: () => stderr };
}

/** How a side is started for a round, and what it leaves to clean up once the bench is done. */
type SideSpec = { name: string; start: () => Promise<Side>; remove?: () => Promise<void> };

async function startBare(): Promise<Side> {
  const side = spawnSide([path.join(here, 'subscription-bare.mjs')], { cwd: path.join(here, '..') });
  const lines = readline.createInterface({ input: side.child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) {
    if (!line.startsWith('{')) continue;
    const { url, control } = JSON.parse(line) as { url: string; control: string };
    return {
      name: 'bare yoga + graphql-ws',
      url,
      token: 'none',
      event: async () => void (await get(`${control}/event`, 'POST')),
      ...side,
    };
  }
  throw new Error(`bare yoga ended before it answered: ${side.stderr()}`);
}

/**
 * Hangar's built server in `serverDir`, on a data directory of its own with one mirror version to follow. The
 * directory (its embedded PostgreSQL, the mirror row, the bench's token) outlives each process, so every round
 * starts on a server as an operator restarts one.
 */
async function hangarSide(name: string, serverDir: string): Promise<SideSpec> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-bench-subs-'));
  // PostgreSQL runs as a user of its own under root: the directories above its cluster must be traversable.
  await fs.chmod(dataDir, 0o755);
  let token: string | undefined;
  const start = async (): Promise<Side> => {
    const port = await freePort();
    const side = spawnSide(['dist/main.js'], {
      cwd: serverDir,
      env: {
        ...process.env,
        HANGAR_DATA_DIR: dataDir,
        PORT: String(port),
        HANGAR_LOG_LEVEL: 'warn',
        HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
        // One caller holds every subscriber here; the caps guard against one caller doing that by accident.
        HANGAR_MAX_SUBSCRIPTIONS_PER_CALLER: '5000',
        HANGAR_MAX_CONNECTIONS: '5000',
        // And from one address (loopback), on a WebSocket or SSE stream each.
        HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '5000',
        HANGAR_MAX_CONNECTIONS_PER_CALLER: '5000',
      },
    });
    const base = `http://127.0.0.1:${port}`;
    for (
      let tries = 0;
      !(await get(`${base}/readyz`).then(
        (t) => t.includes('true'),
        () => false,
      ));
      tries++
    ) {
      if (side.child.exitCode !== null || tries > 1200) throw new Error(`${name} did not start: ${side.stderr()}`);
      await sleep(50);
    }
    // Its embedded PostgreSQL (db/embedded.ts keeps the password beside the cluster, and the postmaster its port).
    const pgDir = path.join(dataDir, 'pg');
    const db = new pg.Client({
      host: '127.0.0.1',
      port: Number((await fs.readFile(path.join(pgDir, 'postmaster.pid'), 'utf8')).split('\n')[3]),
      user: 'postgres',
      password: (await fs.readFile(`${pgDir}.password`, 'utf8')).trim(),
      database: 'hangar',
    });
    await db.connect();
    await db.query(
      `INSERT INTO "MirrorFile" (id, model, version, file, "sourceUrl", state, "bytesDone", "bytesTotal", "updatedAt")
       VALUES (gen_random_uuid(), 'bench', 'v1', 'model.gguf', 'https://hub.example/bench/model.gguf', 'PRESENT', 10, 10, now())
       ON CONFLICT DO NOTHING`,
    );
    token ??= await benchToken(base);
    // Sent as the mirror sends its events (pubsub.ts): NOTIFY, heard back over LISTEN, then fanned out.
    const event = JSON.stringify({ topic: 'mirrorVersion', id: 'bench/v1' });
    return {
      name,
      url: `${base}/graphql`,
      token,
      event: async () => void (await db.query('SELECT pg_notify($1, $2)', ['hangar_events', event])),
      ...side,
      stop: async () => {
        await db.end();
        await side.stop();
      },
    };
  };
  return { name, start, remove: () => fs.rm(dataDir, { recursive: true, force: true }) };
}

/** Resident memory of a side's process, as the kernel counts it. */
async function rssOf(side: Side): Promise<number> {
  const status = await fs.readFile(`/proc/${side.child.pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1]) * 1024;
}

const agent = new http.Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });

function get(url: string, method = 'GET'): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, agent }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve(text));
    });
    req.on('error', reject);
    req.end();
  });
}

type Subscriber = { heard: number; close: () => void };

function overWs(side: Side, onEvent: (s: Subscriber) => void): Subscriber {
  const client: Client = createClient({
    url: side.url.replace('http', 'ws'),
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${side.token}` },
    retryAttempts: 0,
  });
  const sub: Subscriber = { heard: 0, close: () => void client.dispose() };
  client.subscribe(
    { query: QUERY },
    {
      next: (v) => {
        if (v.errors) throw new Error(`${side.name}: ${JSON.stringify(v.errors)}`);
        sub.heard++;
        onEvent(sub);
      },
      error: (e) => console.error(`${side.name}: a subscription failed`, e),
      complete: () => {},
    },
  );
  return sub;
}

function overSse(side: Side, onEvent: (s: Subscriber) => void): Subscriber {
  const body = JSON.stringify({ query: QUERY });
  const target = new URL(side.url);
  const req = http.request({
    host: target.hostname,
    port: target.port,
    path: target.pathname,
    method: 'POST',
    agent,
    headers: {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      accept: 'text/event-stream',
      authorization: `Bearer ${side.token}`,
    },
  });
  const sub: Subscriber = { heard: 0, close: () => req.destroy() };
  req.on('response', (res) => {
    let buffered = '';
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      buffered += chunk;
      let end = buffered.indexOf('\n\n');
      while (end >= 0) {
        const message = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        if (message.includes('event: next')) {
          if (message.includes('"errors"')) throw new Error(`${side.name}: ${message}`);
          sub.heard++;
          onEvent(sub);
        }
        end = buffered.indexOf('\n\n');
      }
    });
  });
  req.on('error', () => {});
  req.end(body);
  return sub;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function round(side: Side, transport: Transport): Promise<Round> {
  let sentAt = 0;
  let measuring = false;
  let arrived = 0;
  let allArrived: () => void = () => {};
  const delays: number[] = [];
  const onEvent = () => {
    if (!measuring) return;
    delays.push(performance.now() - sentAt);
    if (++arrived === SUBSCRIBERS) allArrived();
  };
  const idleRss = await rssOf(side);
  const subs: Subscriber[] = [];
  // In batches: a thousand handshakes at once would measure the accept queue, not the fan-out.
  for (let i = 0; i < SUBSCRIBERS; i += 100) {
    for (let k = i; k < Math.min(SUBSCRIBERS, i + 100); k++) {
      subs.push(transport === 'WebSocket' ? overWs(side, onEvent) : overSse(side, onEvent));
    }
    await sleep(50);
  }
  // Nothing says when a subscription is in place: events until every subscriber has heard one.
  for (let tries = 0; !subs.every((s) => s.heard > 0); tries++) {
    if (tries > 200) throw new Error(`${side.name} over ${transport}: not every subscriber hears events`);
    await side.event();
    await sleep(100);
  }
  await sleep(200);
  measuring = true;
  for (let e = 0; e < EVENTS; e++) {
    arrived = 0;
    let timer: NodeJS.Timeout | undefined;
    const all = new Promise<void>((resolve, reject) => {
      allArrived = resolve;
      timer = setTimeout(
        () => reject(new Error(`${side.name} over ${transport}: only ${arrived} of ${SUBSCRIBERS} heard an event`)),
        30_000,
      );
    });
    sentAt = performance.now();
    await side.event();
    await all.finally(() => clearTimeout(timer));
    await sleep(50);
  }
  measuring = false;
  const rss = await rssOf(side);
  for (const s of subs) s.close();
  delays.sort((a, b) => a - b);
  const at = (q: number) => delays[Math.min(delays.length - 1, Math.floor(q * delays.length))] ?? 0;
  return { p50: at(0.5), p99: at(0.99), rss, idleRss, warnings: [...side.warnings] };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[], digits = 1) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;

const serverDir = path.join(here, '..');
if (!(await checkServerBuild(serverDir)).current) await buildServer();
const bare: SideSpec = { name: 'bare yoga + graphql-ws', start: startBare };
const specs = [
  bare,
  await hangarSide('hangar (this tree)', serverDir),
  ...(OTHER_SERVER ? [await hangarSide(`hangar (${OTHER_SERVER})`, path.resolve(OTHER_SERVER))] : []),
];
const transports: Transport[] = ['WebSocket', 'SSE'];
const results = new Map<string, Round[]>();
try {
  for (let r = 0; r < ROUNDS; r++) {
    for (const transport of transports) {
      for (const spec of specs) {
        // A process of its own for every round: what a round measures is what holding the subscribers costs a
        // server, not what the rounds before it left in its heap (V8 keeps what it grew to).
        const side = await spec.start();
        const key = `${transport} ${spec.name}`;
        try {
          const one = await round(side, transport);
          results.set(key, [...(results.get(key) ?? []), one]);
          process.stderr.write(
            `  round ${r + 1}, ${key}: p50 ${one.p50.toFixed(1)} ms, p99 ${one.p99.toFixed(1)} ms\n`,
          );
        } finally {
          await side.stop();
        }
      }
    }
  }
} finally {
  for (const child of children) child.kill('SIGTERM');
  children.length = 0;
  await Promise.all(specs.map((spec) => spec.remove?.()));
}

console.log(
  `An event's delay to each of ${SUBSCRIBERS} subscribers (mirrorChanged), ${EVENTS} events a round, ${ROUNDS} interleaved rounds, ${os.cpus().length} cores`,
);
// Memory two ways: the whole process, and what holding the subscribers added to it since the round began.
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(0);
for (const transport of transports) {
  const base = results.get(`${transport} ${bare.name}`) ?? [];
  const baseP99 = median(base.map((x) => x.p99));
  const baseRss = median(base.map((x) => x.rss));
  const baseAdded = median(base.map((x) => x.rss - x.idleRss));
  console.log(`  over ${transport}`);
  for (const side of specs) {
    const rs = results.get(`${transport} ${side.name}`) ?? [];
    const p99 = median(rs.map((x) => x.p99));
    const rss = median(rs.map((x) => x.rss));
    const added = median(rs.map((x) => x.rss - x.idleRss));
    const ratio =
      side === bare
        ? 'baseline'
        : `p99 ${(p99 / baseP99).toFixed(2)}× (goal ≤ 1.3×), RSS ${(rss / baseRss).toFixed(2)}× (goal ≤ 1.5×), added ${
            // Garbage collection can leave the baseline's round with less memory than it began with: no ratio then.
            baseAdded >= 2 ** 20 ? `${(added / baseAdded).toFixed(2)}×` : "n/a (the baseline's own is ≤ 0 MiB)"
          }`;
    const warned = [...new Set(rs.flatMap((x) => x.warnings))];
    console.log(
      `    ${side.name.padEnd(28)} p50 ${median(rs.map((x) => x.p50)).toFixed(1)} ms (${spread(rs.map((x) => x.p50))})  p99 ${p99.toFixed(1)} ms (${spread(rs.map((x) => x.p99))})  RSS ${mib(rss)} MiB (${spread(
        rs.map((x) => x.rss / 2 ** 20),
        0,
      )}), +${mib(added)} MiB for the subscribers (${spread(
        rs.map((x) => (x.rss - x.idleRss) / 2 ** 20),
        0,
      )})  ${ratio}${warned.length ? `  warnings: ${warned.join(', ')}` : ''}`,
    );
  }
}
