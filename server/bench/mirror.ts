import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { freePort } from '@hangar/common/free-port';
import { createLogger } from '@hangar/common/log';
import { type App, createApp } from '../src/app.js';
import { loadConfig } from '../src/config.js';
import { benchToken } from './api-token.js';
import { printTrace, startTrace } from './mirror-trace.js';

// The mirror's speed as ratios against the tools an operator would otherwise use, run side by side on the same
// machine and the same filesystem: fetching a large file from a local nginx (Hangar's fetchToMirror against
// `curl | tee FILE | openssl dgst -sha256`, an operator's verified download into a file; `curl -o` and
// `curl | openssl dgst -sha256` shown beside it), and serving it (Hangar's GET /mirror/… against nginx with
// sendfile) to 1 and to 16 concurrent curl clients, with the CPU each server spent per GiB sent. Absolute numbers
// move with the machine; the ratios say what Hangar's streaming costs on top of what the disk and the loopback allow.
//
// HANGAR_BENCH_MIRROR_MB sets the file's size (default 2048), HANGAR_BENCH_MIRROR_ROUNDS how many times each
// measurement is taken (default 5; the median is shown), and HANGAR_BENCH_MIRROR_PARTS which parts run
// (`fetch,serve`, the default; one of them for a quicker run or a profile). `trace` first runs one fetch traced:
// every query Hangar's process sends to PostgreSQL on a timeline from the mutation, with the first and last
// block written (bench/mirror-trace.ts): where a fetch's fixed cost goes.

const MIB = 1024 * 1024;
const SIZE_MB = Number(process.env.HANGAR_BENCH_MIRROR_MB ?? 2048);
if (!Number.isInteger(SIZE_MB) || SIZE_MB < 1 || SIZE_MB > 65536) {
  throw new Error(`HANGAR_BENCH_MIRROR_MB=${process.env.HANGAR_BENCH_MIRROR_MB} is not accepted: MiB from 1 to 65536`);
}
const SIZE = SIZE_MB * MIB;
const ROUNDS = Number(process.env.HANGAR_BENCH_MIRROR_ROUNDS ?? 5);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1 || ROUNDS > 20) {
  throw new Error(`HANGAR_BENCH_MIRROR_ROUNDS=${process.env.HANGAR_BENCH_MIRROR_ROUNDS} is not accepted: 1 to 20`);
}
const PARTS = new Set((process.env.HANGAR_BENCH_MIRROR_PARTS ?? 'fetch,serve').split(',').map((p) => p.trim()));
if (![...PARTS].every((p) => p === 'fetch' || p === 'serve' || p === 'trace')) {
  throw new Error(
    `HANGAR_BENCH_MIRROR_PARTS=${process.env.HANGAR_BENCH_MIRROR_PARTS} is not accepted: fetch, serve, trace, or several joined by a comma`,
  );
}
const CLIENTS = 16;
/** Against `curl | tee FILE | openssl dgst -sha256` (#33). */
const FETCH_GOAL = 0.95;
/** Bytes per second to 16 clients against nginx, and at most this many times nginx's CPU per GiB (#33). */
const SERVE_GOAL = 0.9;
const SERVE_CPU_GOAL = 2;
/** No single step may run longer than this, whatever goes wrong: a bench that hangs is worse than one that fails. */
const STEP_LIMIT_MS = 10 * 60_000;

const root = path.join(os.tmpdir(), `hangar-bench-mirror-${process.pid}`);
const dirs = {
  src: path.join(root, 'src'),
  data: path.join(root, 'data'),
  curl: path.join(root, 'curl'),
  nginx: path.join(root, 'nginx'),
};
const FILE = 'model.bin';

// ─── cleanup: every process and file this run makes, whatever way it ends ─────

const children = new Set<ChildProcess>();
let app: App | undefined;
let cleaning: Promise<void> | undefined;

/** SIGTERM first: nginx's master stops its workers then, while a SIGKILL to it would orphan them. */
async function stopChild(c: ChildProcess) {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const exited = new Promise((r) => c.once('exit', r));
  c.kill('SIGTERM');
  const timer = setTimeout(() => c.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

function cleanup() {
  cleaning ??= (async () => {
    await Promise.all([...children].map(stopChild));
    await app?.stop().catch((err) => console.error('stopping Hangar failed:', err));
    await fs.rm(root, { recursive: true, force: true });
  })();
  return cleaning;
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    console.error(`\n${signal}: cleaning up`);
    void cleanup().finally(() => process.exit(130));
  });
}

// ─── helpers ──────────────────────────────────────────────────────────────────

type Ran = { code: number | null; stdout: string; stderr: string; ms: number };

/** Runs a command, timed from spawn to exit, with its output collected; bounded by STEP_LIMIT_MS. */
function run(cmd: string, args: string[], opts: { cwd?: string } = {}): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(cmd, args, { cwd: opts.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(child);
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), STEP_LIMIT_MS);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      children.delete(child);
      resolve({ code, stdout, stderr, ms: performance.now() - started });
    });
  });
}

/** Until the server answers at all (a 404 counts: the file may not be there yet). */
async function waitForHttp(url: string, what: string) {
  const end = Date.now() + 15_000;
  for (;;) {
    const ok = await fetch(url, { method: 'HEAD' }).then(
      () => true,
      () => false,
    );
    if (ok) return;
    if (Date.now() > end) throw new Error(`${what} did not answer ${url} within 15 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Writes dirty pages out, so one measurement's writeback does not land in the next one's time. */
function sync() {
  spawnSync('sync', { stdio: 'ignore' });
}

const mbps = (bytes: number, ms: number) => bytes / 1e6 / (ms / 1000);

// ─── the file ─────────────────────────────────────────────────────────────────

/** SIZE bytes that no two blocks repeat (a fresh random block with its index stamped in), and their sha256. */
async function generate(file: string): Promise<string> {
  const block = randomBytes(8 * MIB);
  const hash = createHash('sha256');
  const fh = await fs.open(file, 'w', 0o644);
  try {
    for (let at = 0, i = 0; at < SIZE; at += block.length, i++) {
      block.writeUInt32LE(i, 0);
      const part = block.subarray(0, Math.min(block.length, SIZE - at));
      hash.update(part);
      await fh.write(part);
    }
  } finally {
    await fh.close();
  }
  return hash.digest('hex');
}

// ─── the static server: nginx, installed when missing ────────────────────────

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

/** `pid`: its master process, whose children (nginx's workers) count to its CPU too. */
type StaticServer = { url: string; name: string; fallback: boolean; pid: number };

async function startNginx(bin: string): Promise<StaticServer> {
  await fs.mkdir(dirs.nginx, { recursive: true });
  const port = await freePort();
  const n = (p: string) => path.join(dirs.nginx, p);
  const conf = `
daemon off;
worker_processes auto;
pid ${n('nginx.pid')};
error_log ${n('error.log')} warn;
events { worker_connections 1024; }
http {
  access_log ${n('access.log')};
  client_body_temp_path ${n('client_body')};
  proxy_temp_path ${n('proxy')};
  fastcgi_temp_path ${n('fastcgi')};
  uwsgi_temp_path ${n('uwsgi')};
  scgi_temp_path ${n('scgi')};
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 10s;
  server {
    listen 127.0.0.1:${port};
    root ${dirs.src};
  }
}
`;
  await fs.writeFile(n('nginx.conf'), conf);
  const child = spawn(bin, ['-p', dirs.nginx, '-e', n('error.log'), '-c', n('nginx.conf')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  children.add(child);
  let stderr = '';
  child.stderr?.on('data', (d) => (stderr += d));
  child.once('exit', () => children.delete(child));
  const url = `http://127.0.0.1:${port}/${FILE}`;
  await waitForHttp(url, 'nginx').catch(async (err) => {
    const log = await fs.readFile(n('error.log'), 'utf8').catch(() => '');
    throw new Error(`${(err as Error).message}: ${stderr}${log}`);
  });
  const version = spawnSync(bin, ['-v'], { encoding: 'utf8' })
    .stderr.trim()
    .replace(/^nginx version: /, '');
  return { url, name: `${version} (sendfile on)`, fallback: false, pid: child.pid as number };
}

/** Only when nginx cannot be had: a Node file server in a process of its own, streaming without sendfile. */
async function startNodeFallback(): Promise<StaticServer> {
  const port = await freePort();
  const script = `
const http = require('node:http'), fs = require('node:fs'), path = require('node:path');
http.createServer((req, res) => {
  const file = path.join(${JSON.stringify(dirs.src)}, path.basename(req.url));
  fs.stat(file, (err, s) => {
    if (err) return res.writeHead(404).end();
    res.writeHead(200, { 'content-length': s.size, 'content-type': 'application/octet-stream' });
    if (req.method === 'HEAD') return res.end();
    fs.createReadStream(file, { highWaterMark: 1 << 20 }).pipe(res);
  });
}).listen(${port}, '127.0.0.1');
`;
  const child = spawn(process.execPath, ['-e', script], { stdio: 'ignore' });
  children.add(child);
  child.once('exit', () => children.delete(child));
  const url = `http://127.0.0.1:${port}/${FILE}`;
  await waitForHttp(url, 'the Node fallback file server');
  return { url, name: 'Node fallback file server (no sendfile)', fallback: true, pid: child.pid as number };
}

// ─── Hangar ───────────────────────────────────────────────────────────────────

async function startHangar(): Promise<{ base: string; token: string }> {
  const password = 'correct-horse-battery';
  const config = loadConfig({
    HANGAR_DATA_DIR: dirs.data,
    HANGAR_WEB_DIST: path.join(dirs.data, 'no-web-dist'),
    PORT: '0',
    HANGAR_LOG_LEVEL: 'warn',
    HANGAR_ADMIN_PASSWORD: password,
    HANGAR_FETCH_ALLOW: '127.0.0.1', // the file servers measured are on loopback
  });
  app = await createApp({ config, log: createLogger('warn'), print: () => {} });
  const base = await app.start();
  // A token made the way a script gets one.
  const token = await benchToken(base, { password, role: 'OPERATOR' });
  return { base, token };
}

async function gql<T>(base: string, token: string, query: string, variables: Record<string, unknown>): Promise<T> {
  const res = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  const body = (await res.json()) as { data?: T; errors?: unknown };
  if (!body.data) throw new Error(`GraphQL answered HTTP ${res.status}: ${JSON.stringify(body.errors)}`);
  return body.data;
}

/**
 * From the mutation to the version reading PRESENT, watched the way the console watches it: the
 * mirrorVersionChanged subscription over SSE, opened before the mutation. (Polling from this process, which is
 * also Hangar's, would put the poller's own work into Hangar's time.)
 */
async function hangarFetch(base: string, token: string, version: string, url: string, sha256: string) {
  type Version = { state: string; verified: boolean; error: string | null; files: { sha256: string | null }[] };
  const watch = new AbortController();
  const timer = setTimeout(
    () => watch.abort(new Error(`the fetch did not finish in ${STEP_LIMIT_MS / 1000} s`)),
    STEP_LIMIT_MS,
  );
  try {
    const events = await fetch(`${base}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${token}` },
      body: JSON.stringify({
        query:
          'subscription($v: String!) { mirrorVersionChanged(model: "bench", version: $v) { state verified error files { sha256 } } }',
        variables: { v: version },
      }),
      signal: watch.signal,
    });
    if (!events.ok || !events.body) throw new Error(`the subscription answered HTTP ${events.status}`);
    const started = performance.now();
    /** When each state of the version was first heard of, in ms from the mutation: where the fixed cost goes. */
    const seen: Record<string, number> = {};
    const r = await gql<{ fetchToMirror: { __typename: string; message?: string } }>(
      base,
      token,
      `mutation($v: String!, $s: [MirrorSourceInput!]!) { fetchToMirror(model: "bench", version: $v, sources: $s) {
        __typename ... on Error { message } } }`,
      { v: version, s: [{ url, file: FILE, sha256, size: SIZE }] },
    );
    if (r.fetchToMirror.__typename !== 'FetchStarted') throw new Error(JSON.stringify(r.fetchToMirror));
    let text = '';
    const reader = events.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
      for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n')) {
        const line = text.slice(0, nl);
        text = text.slice(nl + 1);
        if (!line.startsWith('data:')) continue;
        const v = (JSON.parse(line.slice(5)) as { data?: { mirrorVersionChanged: Version | null } }).data
          ?.mirrorVersionChanged;
        if (v) seen[v.state] ??= performance.now() - started;
        if (v?.state === 'PRESENT') {
          const ms = performance.now() - started;
          if (!v.verified || v.files[0]?.sha256 !== sha256)
            throw new Error(`fetched but not verified: ${JSON.stringify(v)}`);
          return { ms, seen, started };
        }
        if (v?.state === 'FAILED' || v?.state === 'CANCELLED') throw new Error(`the fetch failed: ${v.error}`);
      }
    }
    throw new Error('the subscription ended before the version was present');
  } finally {
    clearTimeout(timer);
    watch.abort();
  }
}

// ─── the measurements ─────────────────────────────────────────────────────────

type Took = { ms: number; cpuMs: number };

/**
 * A shell pipeline, timed from spawn to exit, with the CPU (user + system) all of its processes used, as bash's
 * `time` reports it on the last line of stderr.
 */
async function pipeline(line: string): Promise<Ran & { cpuMs: number }> {
  const r = await run('bash', ['-o', 'pipefail', '-c', `TIMEFORMAT='%3U %3S'; time ( ${line} )`]);
  const [user = Number.NaN, sys = Number.NaN] = (r.stderr.trim().split('\n').at(-1) ?? '').split(' ').map(Number);
  return { ...r, cpuMs: (user + sys) * 1000 };
}

async function curlTo(url: string, out: string): Promise<Took> {
  const r = await pipeline(`curl -sS --fail -o '${out}' -w '%{size_download}' '${url}'`);
  if (r.code !== 0 || Number(r.stdout) !== SIZE) throw new Error(`curl -o failed (${r.code}): ${r.stderr}`);
  return r;
}

/** What an operator runs to download a file and know its sha256: the bytes written to a file and hashed at once. */
async function curlTeeHash(url: string, out: string, sha256: string): Promise<Took> {
  const r = await pipeline(`curl -sS --fail '${url}' | tee '${out}' | openssl dgst -sha256`);
  const digest = r.stdout.trim().split(/\s+/).at(-1);
  if (r.code !== 0 || digest !== sha256)
    throw new Error(`curl | tee | openssl failed (${r.code}): ${r.stdout}${r.stderr}`);
  return r;
}

async function curlHash(url: string, sha256: string): Promise<Took> {
  const r = await pipeline(`curl -sS --fail '${url}' | openssl dgst -sha256`);
  const digest = r.stdout.trim().split(/\s+/).at(-1);
  if (r.code !== 0 || digest !== sha256) throw new Error(`curl | openssl failed (${r.code}): ${r.stdout}${r.stderr}`);
  return r;
}

const TICK_MS = 1000 / Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim() || 100);

/** CPU milliseconds (user + system) a process and its children (nginx's workers) have used, from /proc. */
async function treeCpuMs(pid: number): Promise<number> {
  let ticks = 0;
  for (const entry of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await fs.readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    // The command may hold spaces and parentheses: the fields are counted after its closing one.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(entry) !== pid && Number(fields[1]) !== pid) continue;
    ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
  }
  return ticks * TICK_MS;
}

/** CPU milliseconds of this process (Hangar runs in it), user + system. */
const selfCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

type Served = { mbps: number; bytes: number; serverCpuMs: number; selfCpuMs: number };

/**
 * `clients` curl processes, each reading `bytes` from the start of the file into /dev/null (a Range request when
 * that is less than the whole file); the bytes all of them got per second, and the CPU the static server (`pid`,
 * with its workers) and this process spent meanwhile.
 */
async function serve(url: string, clients: number, bytes: number, o: { token?: string; pid?: number } = {}) {
  const range = bytes < SIZE ? `-r 0-${bytes - 1}` : '';
  // The mirror asks for a credential by default (HANGAR_MIRROR_REQUIRE_TOKEN), as a node sends its token.
  const auth = o.token ? `-H 'Authorization: Bearer ${o.token}'` : '';
  const expect = `${bytes < SIZE ? 206 : 200} ${bytes}`;
  // The clients are started by one shell rather than by this process: forking this process (Hangar's) sixteen
  // times would stop Hangar's event loop for each fork, in Hangar's time and on Hangar's CPU, and never nginx's.
  const curl = `curl -sS --fail ${auth} ${range} -o /dev/null -w '%{http_code} %{size_download}\n' '${url}'`;
  const cpuBefore = o.pid ? await treeCpuMs(o.pid) : 0;
  const selfBefore = selfCpuMs();
  const started = performance.now();
  const r = await run('bash', ['-c', `for i in $(seq ${clients}); do ${curl} & done; wait`]);
  const ms = performance.now() - started;
  const self = selfCpuMs() - selfBefore;
  const server = o.pid ? (await treeCpuMs(o.pid)) - cpuBefore : 0;
  const answers = r.stdout.trim().split('\n');
  if (answers.length !== clients || answers.some((a) => a !== expect))
    throw new Error(`a client failed on ${url}: ${r.stdout} ${r.stderr}`);
  return { mbps: mbps(clients * bytes, ms), bytes: clients * bytes, serverCpuMs: server, selfCpuMs: self } as Served;
}

/** How much of a file the page cache holds (0 to 1), or null without util-linux's fincore. */
function resident(file: string): number | null {
  const r = spawnSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file], { encoding: 'utf8' });
  return r.status === 0 ? Number(r.stdout.trim()) / SIZE : null;
}

/** The median of a few runs, and their spread: one run on a shared disk says little. */
function summary(values: number[]) {
  const sorted = [...values].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)] ?? 0;
  const spread = sorted.length > 1 ? `${sorted[0]?.toFixed(0)}–${sorted.at(-1)?.toFixed(0)}` : '';
  return { median, text: `${median.toFixed(0).padStart(5)} MB/s ${spread.padStart(10)}` };
}

const row = (label: string, value: string, note = '') => console.log(`  ${label.padEnd(54)} ${value}   ${note}`);
const ratio = (x: number, base: number, goal: number) =>
  `${(x / base).toFixed(2)}× ${x / base >= goal ? '(goal ≥ ' : '(BELOW the goal of '}${goal}×)`;

async function main() {
  for (const tool of ['curl', 'openssl']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) throw new Error(`${tool} is needed on PATH`);
  }
  await fs.mkdir(root, { recursive: true, mode: 0o755 }); // nginx's workers and PostgreSQL's user read below it
  for (const d of Object.values(dirs)) await fs.mkdir(d, { recursive: true, mode: 0o755 });

  const nginxBin = installNginx();
  const upstream = nginxBin ? await startNginx(nginxBin) : await startNodeFallback();
  const baseline = upstream.fallback ? 'the NODE FALLBACK (not nginx!)' : 'nginx';
  if (upstream.fallback) {
    console.log(
      '\n!!!!!!!! nginx could not be found or installed: the baseline below is a NODE FILE SERVER WITHOUT SENDFILE,\n' +
        '!!!!!!!! not nginx. Every ratio against it flatters Hangar. Install nginx and run again.\n',
    );
  }

  const t = performance.now();
  const sha256 = await generate(path.join(dirs.src, FILE));
  sync();
  const generated = performance.now() - t;
  const { base, token } = await startHangar();
  console.log(
    `\nMirror, a ${SIZE_MB} MiB file (made and synced in ${(generated / 1000).toFixed(1)} s) over loopback from ` +
      `${upstream.name}, ${os.cpus().length} cores, ${ROUNDS} rounds after one not counted; MB = 10^6 bytes; median and range`,
  );
  // Anything else running shows here first: on two cores a test run elsewhere moves every number.
  const load = () => os.loadavg()[0]?.toFixed(1);
  console.log(`load average ${load()} at the start`);

  if (PARTS.has('trace')) {
    // One fetch with every query it sends on a timeline: where the time around the download loop goes. First,
    // while no copy of the file is held (one would be linked rather than downloaded), after one untraced fetch
    // that starts what a process starts once (the hashing thread, prepared statements).
    await hangarFetch(base, token, 'untraced', upstream.url, sha256);
    await removeVersion(base, token, 'untraced');
    sync();
    const trace = await startTrace();
    try {
      const { ms, seen, started } = await hangarFetch(base, token, 'traced', upstream.url, sha256);
      printTrace(started, trace.events, trace.writes(), seen, ms);
    } finally {
      trace.stop();
    }
    await removeVersion(base, token, 'traced');
    sync();
  }
  // (a) fetch, the four ways taking turns at going first, after a round that is not counted: on a VM the first
  // writes into memory the guest has not used lately run at a fraction of the speed of later ones, whoever makes
  // them. Each copy is deleted (its dirty pages dropped) or synced before the next starts, so no copy's
  // writeback runs inside another's time.
  const hangarVersion = `r${ROUNDS}`;
  if (PARTS.has('fetch')) {
    type Way = { speed: number[]; cpu: number[]; go: (round: number) => Promise<Took> };
    const way = (go: Way['go']): Way => ({ speed: [], cpu: [], go });
    const curlOut = path.join(dirs.curl, FILE);
    const curl = way(async () => {
      const took = await curlTo(upstream.url, curlOut);
      await fs.rm(curlOut);
      return took;
    });
    const hashed = way(() => curlHash(upstream.url, sha256));
    const tee = way(async () => {
      const took = await curlTeeHash(upstream.url, curlOut, sha256);
      await fs.rm(curlOut);
      return took;
    });
    // Hangar's CPU is this process's (Hangar runs in it), PostgreSQL's left out.
    const claimed: number[] = [];
    const hangar = way(async (round) => {
      const cpu = selfCpuMs();
      const { ms, seen } = await hangarFetch(base, token, `r${round}`, upstream.url, sha256);
      const cpuMs = selfCpuMs() - cpu;
      if (round > 0) claimed.push(seen.FETCHING ?? Number.NaN);
      // The last copy stays, to be served in (b).
      if (round < ROUNDS) await removeVersion(base, token, `r${round}`);
      return { ms, cpuMs };
    });
    const ways = [curl, hashed, tee, hangar];
    for (let round = 0; round <= ROUNDS; round++) {
      for (let i = 0; i < ways.length; i++) {
        const w = ways[(i + round) % ways.length] as Way;
        const took = await w.go(round);
        if (round > 0) {
          w.speed.push(mbps(SIZE, took.ms));
          w.cpu.push(took.cpuMs / (SIZE / (1024 * MIB)));
        }
        sync();
      }
    }
    const [c, h, t, g] = ways.map((w) => ({ ...summary(w.speed), cpu: cpuSummary(w.cpu) })) as [
      Summary,
      Summary,
      Summary,
      Summary,
    ];
    console.log(`(a) fetch into ${os.tmpdir()} from ${baseline}; CPU ms per GiB of every process of the way`);
    row('curl -o', c.text, c.cpu.text);
    row('curl | openssl dgst -sha256 (no file written)', h.text, h.cpu.text);
    row('curl | tee FILE | openssl dgst -sha256', t.text, `${t.cpu.text}  baseline`);
    row(
      'Hangar fetchToMirror (mutation → PRESENT, verified)',
      g.text,
      `${g.cpu.text}  ${ratio(g.median, t.median, FETCH_GOAL)}; ${(g.median / c.median).toFixed(2)}× curl -o, ` +
        `${(g.median / h.median).toFixed(2)}× curl | openssl`,
    );
    // Part of what a file costs whatever its size: from the mutation until the console hears the worker claimed
    // it (FETCHING). On a 2 GiB file at 700 MB/s every 30 ms of fixed cost is 1 % of the ratio.
    const c0 = cpuSummary(claimed);
    console.log(`  Hangar: mutation → FETCHING heard, median ${c0.median.toFixed(0)} ms`);
  } else if (PARTS.has('serve')) {
    await hangarFetch(base, token, hangarVersion, upstream.url, sha256);
    sync();
  }
  if (!PARTS.has('serve')) {
    console.log(`load average ${load()} at the end`);
    return;
  }

  // (b) serve: the same curl clients against the static server and against Hangar, taking turns at going first.
  // Both files are read once first, so the comparison is between the servers, not a cached file and a cold one;
  // whether they stayed cached is printed, since on a shared machine the page cache can be taken back.
  // CPU: the static server's from /proc (its master and workers); Hangar's is this process's, less what the same
  // round costs this process against the static server (starting the curl clients and reading their output).
  const hangarUrl = `${base}/mirror/bench/${hangarVersion}/${FILE}`;
  const files = [path.join(dirs.src, FILE), path.join(dirs.data, 'mirror', 'files', 'bench', hangarVersion, FILE)];
  for (const f of files) {
    const r = await run('dd', [`if=${f}`, 'of=/dev/null', 'bs=4M']);
    if (r.code !== 0) throw new Error(`could not read ${f}: ${r.stderr}`);
  }
  const cached = () =>
    files
      .map(resident)
      .map((r) => (r === null ? '?' : `${Math.floor(r * 100)} %`))
      .join(' / ');
  const before = cached();
  // Every client reads the whole file alone; with 16 at once, the first part of it, to keep the run short.
  const perClient = Math.min(SIZE, 512 * MIB);
  console.log(`(b) serve to curl -o /dev/null clients: ${baseline} vs Hangar GET /mirror/…; CPU ms per GiB sent`);
  const GIB = 1024 * MIB;
  for (const [clients, bytes] of [
    [1, SIZE],
    [CLIENTS, perClient],
  ] as const) {
    const served = { nginx: [] as number[], hangar: [] as number[] };
    const cpu = { nginx: [] as number[], hangar: [] as number[] };
    const toNginx = async () => {
      const r = await serve(upstream.url, clients, bytes, { pid: upstream.pid });
      served.nginx.push(r.mbps);
      cpu.nginx.push(r.serverCpuMs / (r.bytes / GIB));
      return r.selfCpuMs;
    };
    const toHangar = async () => {
      const r = await serve(hangarUrl, clients, bytes, { token });
      served.hangar.push(r.mbps);
      return r;
    };
    await serve(upstream.url, clients, bytes); // not counted, like (a)'s first round
    await serve(hangarUrl, clients, bytes, { token });
    for (let round = 1; round <= ROUNDS; round++) {
      let benchSelf = 0;
      if (round % 2) benchSelf = await toNginx();
      const h = await toHangar();
      if (!(round % 2)) benchSelf = await toNginx();
      cpu.hangar.push(Math.max(0, h.selfCpuMs - benchSelf) / (h.bytes / GIB));
    }
    const who = `${clients} × ${bytes / MIB} MiB`;
    const n = summary(served.nginx);
    const h = summary(served.hangar);
    const nc = cpuSummary(cpu.nginx);
    const hc = cpuSummary(cpu.hangar);
    row(`${who}: ${baseline}`, n.text, `${nc.text}  baseline`);
    const cpuRatio = hc.median / nc.median;
    // The goals are for the 16 clients (#33); one client's ratios are shown for what they say.
    const goals = clients === CLIENTS;
    row(
      `${who}: Hangar`,
      h.text,
      `${hc.text}  ${goals ? ratio(h.median, n.median, SERVE_GOAL) : `${(h.median / n.median).toFixed(2)}×`}; ` +
        // /proc counts in ticks (10 ms): a small file can cost nginx none that it shows.
        `CPU ${nc.median > 0 ? `${cpuRatio.toFixed(2)}×` : "n/a (nginx's below /proc's tick)"}${goals ? (cpuRatio <= SERVE_CPU_GOAL ? ` (goal ≤ ${SERVE_CPU_GOAL}×)` : ` (ABOVE the goal of ≤ ${SERVE_CPU_GOAL}×)`) : ''}`,
    );
  }
  console.log(`  page cache held (nginx's file / Hangar's): ${before} before, ${cached()} after`);
  console.log(`load average ${load()} at the end`);
  if (upstream.fallback) console.log('\n!!!!!!!! Again: the baseline was a Node fallback server, NOT nginx.');
}

function removeVersion(base: string, token: string, version: string) {
  return gql(base, token, 'mutation($v: String!) { removeMirrorVersion(model: "bench", version: $v) { __typename } }', {
    v: version,
  });
}

type Summary = ReturnType<typeof summary> & { cpu: ReturnType<typeof cpuSummary> };

/** CPU ms per GiB: the median and range of the rounds. */
function cpuSummary(values: number[]) {
  const sorted = [...values].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)] ?? 0;
  const range = sorted.length > 1 ? ` ${sorted[0]?.toFixed(0)}–${sorted.at(-1)?.toFixed(0)}` : '';
  return { median, text: `CPU ${median.toFixed(0).padStart(4)} ms/GiB${range.padStart(10)}` };
}

try {
  await main();
} finally {
  await cleanup();
}
