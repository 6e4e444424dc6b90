import { type ChildProcess, spawn } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { type Client, createClient } from 'graphql-ws';
import WebSocket from 'ws';

// An event's delay at 1000 subscribers: from the moment it is sent (the mirror's NOTIFY for Hangar, a publish
// for bare Yoga) to the moment each subscriber has it, over graphql-ws and over SSE, and each server's resident
// memory while it holds them. Bare graphql-yoga on Hangar's SDL, answering from a constant, is the baseline.
// Each side runs in its own process (bench/subscription-server.ts); the rounds are interleaved (bare, hangar,
// bare, hangar, …) and the median round is reported with the spread. Goals (#17): p99 ≤ 1.3× bare Yoga's,
// RSS ≤ 1.5×.
//
//   tsx bench/subscriptions.ts [subscribers] [rounds] [events per round] [another server/src to compare]

const SUBSCRIBERS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const EVENTS = Number(process.argv[4] ?? 20);
const OTHER_SRC = process.argv[5];
const QUERY = 'subscription { mirrorChanged { id state bytesDone bytesTotal percent usedBy { name } } }';
const here = path.dirname(fileURLToPath(import.meta.url));

type Side = { name: string; url: string; control: string; token: string; child: ChildProcess };
type Transport = 'WebSocket' | 'SSE';
type Round = { p50: number; p99: number; rss: number; idleRss: number; warnings: string[] };

const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

async function startSide(name: string, args: string[]): Promise<Side> {
  // BENCH_CPU_PROF=<dir> writes each side's CPU profile there when it stops, to see where a fan-out's time goes.
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  const child = spawn(
    process.execPath,
    [...profile, '--import', 'tsx', path.join(here, 'subscription-server.ts'), ...args],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  children.push(child);
  const lines = readline.createInterface({ input: child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) {
    if (!line.startsWith('{')) continue;
    return { name, child, ...(JSON.parse(line) as { url: string; control: string; token: string }) };
  }
  throw new Error(`${name}: the server ended before it answered`);
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
  const idle = JSON.parse(await get(`${side.control}/memory`)) as { rss: number };
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
    await get(`${side.control}/event`, 'POST');
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
    await get(`${side.control}/event`, 'POST');
    await all.finally(() => clearTimeout(timer));
    await sleep(50);
  }
  measuring = false;
  const memory = JSON.parse(await get(`${side.control}/memory`)) as { rss: number; warnings: string[] };
  for (const s of subs) s.close();
  // Let the server let go of them before the next round measures its memory.
  await sleep(1500);
  delays.sort((a, b) => a - b);
  const at = (q: number) => delays[Math.min(delays.length - 1, Math.floor(q * delays.length))] ?? 0;
  return { p50: at(0.5), p99: at(0.99), rss: memory.rss, idleRss: idle.rss, warnings: memory.warnings };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
const spread = (xs: number[], digits = 1) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;

const sides = [
  await startSide('bare yoga + graphql-ws', ['bare']),
  await startSide('hangar (this tree)', ['hangar', path.join(here, '../src')]),
  ...(OTHER_SRC ? [await startSide(`hangar (${OTHER_SRC})`, ['hangar', path.resolve(OTHER_SRC)])] : []),
];
const transports: Transport[] = ['WebSocket', 'SSE'];
const results = new Map<string, Round[]>();
try {
  for (let r = 0; r < ROUNDS; r++) {
    for (const transport of transports) {
      for (const side of sides) {
        const key = `${transport} ${side.name}`;
        const one = await round(side, transport);
        results.set(key, [...(results.get(key) ?? []), one]);
        process.stderr.write(`  round ${r + 1}, ${key}: p50 ${one.p50.toFixed(1)} ms, p99 ${one.p99.toFixed(1)} ms\n`);
      }
    }
  }
} finally {
  for (const child of children) child.kill('SIGTERM');
  children.length = 0;
}

console.log(
  `An event's delay to each of ${SUBSCRIBERS} subscribers (mirrorChanged), ${EVENTS} events a round, ${ROUNDS} interleaved rounds, ${os.cpus().length} cores`,
);
// Memory two ways: the whole process (both sides run through tsx here, which holds every compiled source of
// Hangar's: about 50 MiB more than its built dist/ would), and what holding the subscribers added to it since
// the round began.
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(0);
for (const transport of transports) {
  const base = results.get(`${transport} ${sides[0]?.name}`) ?? [];
  const baseP99 = median(base.map((x) => x.p99));
  const baseRss = median(base.map((x) => x.rss));
  const baseAdded = median(base.map((x) => x.rss - x.idleRss));
  console.log(`  over ${transport}`);
  for (const side of sides) {
    const rs = results.get(`${transport} ${side.name}`) ?? [];
    const p99 = median(rs.map((x) => x.p99));
    const rss = median(rs.map((x) => x.rss));
    const added = median(rs.map((x) => x.rss - x.idleRss));
    const ratio =
      side === sides[0]
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
