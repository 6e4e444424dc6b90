import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '@hangar/common/free-port';
import { type Client, createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { benchToken } from './api-token.js';

// Issue #26, item 5, measured: a well-behaved client's latency while one viewer token holds 1,100 idle
// WebSockets (spread over 11 addresses, 100 each, so that the caller's share is what stops them, not the
// address's) and one address trickles headers on 300 sockets. Hangar runs in a process of its own with its
// default limits (HANGAR_MAX_CONNECTIONS 1024) and its embedded PostgreSQL; the attack and the client run here.
// The client, from an address of its own, asks GET /healthz, POST /graphql and GET /v1/models in turn, each on a
// new connection, first with no attack (the baseline), then under it. Linux only (127/8 is all loopback).
//
//   tsx bench/connection-attack.ts [requests] [--shares-off]
//
// --shares-off sets the per-address and per-caller shares to the whole server and the idle close to a day: the
// server as it was before them (but for the pending-headers budget, which has no setting).

const REQUESTS = Number(process.argv.find((a) => /^\d+$/.test(a)) ?? 60);
const SHARES_OFF = process.argv.includes('--shares-off');
const here = path.dirname(fileURLToPath(import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function startHangar(): Promise<{ base: string; child: ChildProcess; dataDir: string }> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-attack-'));
  // As root, the embedded PostgreSQL runs as the postgres user, who must reach its directory under this one.
  await fs.chmod(dataDir, 0o755);
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
    cwd: path.join(here, '..'),
    stdio: ['ignore', 'ignore', 'inherit'],
    env: {
      ...process.env,
      PORT: String(port),
      HANGAR_DATA_DIR: dataDir,
      HANGAR_LOG_LEVEL: 'error',
      HANGAR_ADMIN_PASSWORD: 'correct-horse-battery',
      HANGAR_HUB_URL: 'off',
      ...(SHARES_OFF
        ? {
            HANGAR_MAX_CONNECTIONS_PER_ADDRESS: '1024',
            HANGAR_MAX_CONNECTIONS_PER_CALLER: '1024',
            HANGAR_WS_IDLE_SECONDS: '86400',
          }
        : {}),
    },
  });
  const base = `http://127.0.0.1:${port}`;
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  for (let i = 0; i < 600 && !exited; i++) {
    const ready = await fetch(`${base}/readyz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ready) return { base, child, dataDir };
    await sleep(200);
  }
  throw new Error(exited ? 'Hangar exited before it was ready' : 'Hangar did not become ready in 120 s');
}

function webSocketFrom(address: string) {
  return class extends WebSocket {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols, { localAddress: address });
    }
  };
}

function idleWebSocket(base: string, address: string, token: string) {
  const held = { client: undefined as unknown as Client, connected: false, settled: false };
  held.client = createClient({
    url: `${base.replace('http', 'ws')}/graphql`,
    webSocketImpl: webSocketFrom(address),
    connectionParams: { authorization: `Bearer ${token}` },
    lazy: false,
    retryAttempts: 0,
    onNonLazyError: () => {},
    on: {
      connected: () => {
        held.connected = true;
        held.settled = true;
      },
      closed: () => {
        held.settled = true;
      },
    },
  });
  return held;
}

function trickler(base: string, address: string) {
  const { hostname, port } = new URL(base);
  const socket = net.connect({ port: Number(port), host: hostname, localAddress: address });
  const s = { open: true, stop: () => socket.destroy() };
  socket.on('error', () => {});
  socket.on('close', () => {
    s.open = false;
    clearInterval(timer);
  });
  socket.on('connect', () => socket.write('GET /healthz HTTP/1.1\r\nHost: hangar\r\n'));
  const timer = setInterval(() => socket.writable && socket.write('x'), 1000);
  return s;
}

function request(
  address: string,
  url: string,
  o: { method?: string; headers?: Record<string, string>; body?: string },
) {
  return new Promise<number>((resolve, reject) => {
    const req = http.request(
      url,
      { method: o.method ?? 'GET', headers: o.headers, localAddress: address, agent: false, timeout: 10_000 },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('timeout', () => req.destroy(new Error('no answer in 10 s')));
    req.on('error', reject);
    req.end(o.body);
  });
}

/** The well-behaved client: REQUESTS requests, one at a time, each on a new connection; latencies in ms. */
async function wellBehaved(base: string, token: string) {
  const auth = { authorization: `Bearer ${token}` };
  const asks = [
    () => request('127.0.0.3', `${base}/healthz`, {}),
    () =>
      request('127.0.0.3', `${base}/graphql`, {
        method: 'POST',
        headers: { ...auth, 'content-type': 'application/json' },
        body: JSON.stringify({ query: '{ viewer { role } }' }),
      }),
    () => request('127.0.0.3', `${base}/v1/models`, { headers: auth }),
  ];
  const ms: number[] = [];
  let failed = 0;
  for (let i = 0; i < REQUESTS; i++) {
    const start = performance.now();
    try {
      const status = await asks[i % asks.length]!();
      if (status !== 200) failed++;
      else ms.push(performance.now() - start);
    } catch {
      failed++;
    }
  }
  ms.sort((a, b) => a - b);
  const at = (q: number) => (ms.length ? ms[Math.min(ms.length - 1, Math.floor(q * ms.length))]!.toFixed(1) : '-');
  return `${ms.length}/${REQUESTS} answered, p50 ${at(0.5)} ms, max ${ms.length ? ms.at(-1)!.toFixed(1) : '-'} ms, ${failed} failed`;
}

const { base, child, dataDir } = await startHangar();
try {
  const attacker = await benchToken(base, { role: 'VIEWER' });
  const client = await benchToken(base, { role: 'VIEWER' });
  console.log(`Hangar ${SHARES_OFF ? 'with the shares off' : 'with its default shares'}, ${os.cpus().length} cores`);
  console.log(`  no attack:    ${await wellBehaved(base, client)}`);

  const held = Array.from({ length: 1100 }, (_, i) => idleWebSocket(base, `127.0.0.${10 + (i % 11)}`, attacker));
  for (let i = 0; i < 1500 && held.some((h) => !h.settled); i++) await sleep(20);
  const tricklers = Array.from({ length: 300 }, () => trickler(base, '127.0.0.4'));
  await sleep(2000);
  const wsHeld = held.filter((h) => h.connected).length;
  const trickling = tricklers.filter((t) => t.open).length;
  console.log(`  under attack: ${await wellBehaved(base, client)}`);
  console.log(
    `  the attack held ${wsHeld} of 1100 WebSockets and ${trickling} of 300 trickling sockets (${tricklers.filter((t) => t.open).length} still open at the end)`,
  );
  for (const h of held) void h.client.dispose();
  for (const t of tricklers) t.stop();
} finally {
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));
  await fs.rm(dataDir, { recursive: true, force: true });
}
process.exit(0);
