import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { createAgent } from '@hangar/agent/agent';
import { AgentConfigError, loadAgentConfig } from '@hangar/agent/config';
import { ControlPlaneError } from '@hangar/agent/control-plane';
import {
  type DownloadOptions,
  downloadFile,
  GraphqlTrainControl,
  parseTrainSpec,
  type TrainAssignment,
  type TrainControl,
  type TrainProgressInput,
  TrainSpecError,
  type UploadResult,
} from '@hangar/agent/train-control';
import { TrainWorker, type TrainWorkerOptions } from '@hangar/agent/trainer';
import { createLogger } from '@hangar/common/log';
import { type PeftTarContents, packDirectory, readPeftTar } from '@hangar/common/peft/peft-tar';
import { useServer } from 'graphql-ws/use/ws';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, type TrainingWorld, trainingWorld, writeAdapterDir } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// The training worker against an in-memory control plane that keeps the contract's rules (docs/training.md: one
// claim per job, reports and finishes refused once a job has ended), with the real pieces under it: files over
// real HTTP from a stand-in for Hangar (which wants the node token) and one for the registry (which must never
// see it), a real trainer process (a small node script that speaks the trainer's protocol; the GPU is what
// cannot be had here), and the real adapter tar, checked by the control plane's own reader.

const TOKEN = 'hgn_test-node-token';
const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
const DATA = Buffer.from(['{"q":"a","a":"b"}', '{"q":"c","a":"d"}', '{"q":"e","a":"f"}'].map((l) => `${l}\n`).join(''));
const CONFIG = Buffer.from('{"model_type":"llama","hidden_size":8}');
const WEIGHTS = Buffer.alloc(4096, 7);

type FileServer = {
  url: string;
  origin: string;
  requests: { path: string; auth: string | null }[];
  close(): Promise<void>;
};

/** A tiny HTTP file server; `files` answers a path with its bytes, or undefined for 404. */
async function serveFiles(
  files: (p: string) => Buffer | undefined,
  o: { requireToken?: string; refuseTokens?: boolean },
): Promise<FileServer> {
  const requests: FileServer['requests'] = [];
  const server = http.createServer((req, res) => {
    const p = new URL(req.url ?? '/', 'http://x').pathname;
    const auth = req.headers.authorization ?? null;
    requests.push({ path: p, auth });
    if (o.requireToken && auth !== `Bearer ${o.requireToken}`) return void res.writeHead(401).end('a node token');
    if (o.refuseTokens && auth) return void res.writeHead(400).end('this host must never be sent a token');
    const body = files(p);
    if (!body) return void res.writeHead(404).end('no such file');
    res.writeHead(200, { 'content-length': String(body.length) }).end(body);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    origin: new URL(url).origin,
    requests,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

type Job = { a: TrainAssignment; spec: unknown; stolen?: boolean };

/** Stands in for the control plane's training API: the rules of docs/training.md, in memory. */
class FakeTrainControl implements TrainControl {
  jobs = new Map<string, Job>();
  reports: { id: string; input: TrainProgressInput; at: number }[] = [];
  finishes: { id: string; state: string; message?: string; trainerAlive: boolean | null }[] = [];
  uploads: { id: string; contents: PeftTarContents }[] = [];
  claims: string[] = [];
  /** The next this-many reports fail as if the control plane were restarting. */
  dropReports = 0;
  /** These calls find nobody there (the control plane is down) until cleared; each try is counted. */
  away = new Set<'report' | 'upload' | 'finish'>();
  awayTries = { report: 0, upload: 0, finish: 0 };
  private reconnected: (() => void) | undefined;
  uploadAnswer: UploadResult | undefined;
  /** Read at finish time: whether the trainer's process was still there when the job was reported ended. */
  pidFile: string | undefined;
  private listener: ((jobs: TrainAssignment[]) => void) | undefined;

  constructor(private readonly hangar: FileServer) {}

  work(onWork: (jobs: TrainAssignment[]) => void, onReconnected?: () => void) {
    this.listener = onWork;
    this.reconnected = onReconnected;
    setImmediate(() => this.push());
    return () => {
      this.listener = undefined;
    };
  }

  /** The control plane is back: the work connection is made again, and the list sent as on every connect. */
  back() {
    this.away.clear();
    this.reconnected?.();
    this.push();
  }

  private check(op: 'report' | 'upload' | 'finish') {
    if (!this.away.has(op)) return;
    this.awayTries[op]++;
    throw new ControlPlaneError('http://hangar did not answer: ECONNREFUSED', 'unreachable');
  }

  /** Sends the node's list, as the subscription does on connect and on every change. */
  push() {
    const list = [...this.jobs.values()]
      .filter((j) => j.a.state === 'QUEUED' || j.a.state === 'RUNNING')
      .map((j) => ({ ...j.a }));
    this.listener?.(list);
  }

  add(id: string, spec: unknown, o: Partial<TrainAssignment> & { stolen?: boolean } = {}) {
    const { stolen, ...a } = o;
    this.jobs.set(id, {
      a: { id, name: `job-${id}`, state: 'QUEUED', gpuMiB: 1000, cancelRequested: false, ...a },
      spec,
      stolen,
    });
    this.push();
  }

  async claim(id: string) {
    this.claims.push(id);
    const j = this.jobs.get(id);
    if (!j) throw new ControlPlaneError(`claimTrainJob: no training job ${id}`, 'refused', 'NotFoundError');
    if (j.stolen) {
      // Another runner with this node's token got there first: the job is RUNNING, just not here.
      j.a.state = 'RUNNING';
      queueMicrotask(() => this.push());
    }
    if (j.a.state !== 'QUEUED')
      throw new ControlPlaneError('claimTrainJob: another runner claimed the job first', 'refused', 'ConflictError');
    j.a.state = 'RUNNING';
    queueMicrotask(() => this.push());
    return { spec: parseTrainSpec(j.spec, this.hangar.url) };
  }

  private running(op: string, id: string) {
    const j = this.jobs.get(id);
    if (j?.a.state !== 'RUNNING')
      throw new ControlPlaneError(
        `${op}: the job is ${j?.a.state.toLowerCase() ?? 'unknown'}: a report for it changes nothing`,
        'refused',
        'ConflictError',
      );
    return j;
  }

  async report(id: string, input: TrainProgressInput) {
    this.check('report');
    if (this.dropReports > 0) {
      this.dropReports--;
      throw new ControlPlaneError('http://hangar did not answer: ECONNREFUSED', 'unreachable');
    }
    this.running('reportTrainProgress', id);
    this.reports.push({ id, input: structuredClone(input), at: performance.now() });
  }

  async finish(id: string, state: 'DONE' | 'FAILED' | 'CANCELLED', message?: string) {
    this.check('finish');
    const j = this.running('finishTrainJob', id);
    if (state === 'DONE' && !this.uploads.some((u) => u.id === id))
      throw new ControlPlaneError(
        'finishTrainJob: upload the adapter before finishing DONE',
        'refused',
        'ConflictError',
      );
    this.finishes.push({ id, state, message, trainerAlive: this.pidFile ? await alive(this.pidFile) : null });
    j.a.state = state;
    this.push();
  }

  download(url: string, dest: string, opts?: DownloadOptions) {
    return downloadFile(url, dest, { ...opts, auth: { origin: this.hangar.origin, token: TOKEN } });
  }

  async upload(id: string, tarGz: Readable): Promise<UploadResult> {
    tarGz.once('error', () => {});
    if (this.away.has('upload')) tarGz.destroy();
    this.check('upload');
    this.running('upload', id);
    const contents = await readPeftTar(tarGz);
    this.uploads.push({ id, contents });
    if (this.uploadAnswer?.accepted === false) this.jobs.get(id)!.a.state = 'FAILED';
    return (
      this.uploadAnswer ?? {
        accepted: true,
        artifacts: [{ kind: 'peft', size: contents.compressedBytes, sha256: contents.sha256 }],
      }
    );
  }

  /** The operator's cancelTrainJob on a running job. */
  cancel(id: string) {
    this.jobs.get(id)!.a.cancelRequested = true;
    this.push();
  }

  /** The control plane ended the job on its own (the lease ran out): later reports are refused. */
  expire(id: string) {
    this.jobs.get(id)!.a.state = 'FAILED';
    this.push();
  }

  points(id: string) {
    return this.reports.filter((r) => r.id === id).flatMap((r) => r.input.points ?? []);
  }

  events(id: string) {
    return this.reports.filter((r) => r.id === id).flatMap((r) => r.input.events ?? []);
  }
}

async function alive(pidFile: string) {
  const pid = Number(await fs.readFile(pidFile, 'utf8').catch(() => 'NaN'));
  if (!Number.isInteger(pid)) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// Stands in for packages/agent/trainer/train_lora.py: the protocol of docs/training.md, with timing and failures set by
// the job's "test" key (the agent passes keys it does not know through to job.json).
const TRAINER = `
import fs from 'node:fs';
import path from 'node:path';
const args = process.argv.slice(2);
const job = JSON.parse(fs.readFileSync(args[args.indexOf('--job') + 1], 'utf8'));
const out = args[args.indexOf('--out') + 1];
const t = job.test ?? {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
if (t.pidFile) fs.writeFileSync(t.pidFile, String(process.pid));
if (t.envFile) fs.writeFileSync(t.envFile, process.env.CUDA_VISIBLE_DEVICES ?? 'unset');
process.on('SIGTERM', () => {
  console.log(t.ignoreTerm ? 'ignoring SIGTERM' : 'stopping on SIGTERM');
  if (!t.ignoreTerm) process.exit(143);
});
const pairs = fs.readFileSync(job.data_path, 'utf8').trim().split('\\n').length;
const config = JSON.parse(fs.readFileSync(path.join(job.base_dir, 'config.json'), 'utf8'));
const weights = fs.statSync(path.join(job.base_dir, 'model.safetensors')).size;
console.log('base files: ' + fs.readdirSync(job.base_dir).sort().join(', '));
console.log('read ' + pairs + ' pairs; base ' + config.model_type + ', ' + weights + ' bytes of weights; out ' + (out === job.out_dir));
if (t.quietMs) await sleep(t.quietMs);
const steps = t.steps ?? 5;
console.log(JSON.stringify({ event: 'start', steps }));
for (let i = 1; i <= steps; i++) {
  if (t.stepMs) await sleep(t.stepMs);
  console.log(JSON.stringify({ event: 'step', step: i, loss: 2 / i, lr: 0.0002, peak_mib: 1000.4, tokens_per_s: 50 }));
}
if (t.nan) console.log('{"event": "step", "step": ' + (steps + 1) + ', "loss": NaN}');
if (t.hang) setInterval(() => {}, 1000);
else if (t.fail) {
  console.error('Traceback (most recent call last):');
  console.log(JSON.stringify({ event: 'error', message: t.fail }));
  process.exit(1);
} else if (t.crash) {
  for (let i = 1; i <= 30; i++) console.error('stderr line ' + i);
  process.exit(3);
} else {
  if (!t.noFiles) {
    fs.writeFileSync(path.join(out, 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', r: job.params.rank }));
    fs.writeFileSync(path.join(out, 'adapter_model.safetensors'), Buffer.alloc(64, 1));
  }
  console.log('{"event":"done"}');
}
`;

let hangar: FileServer;
let registry: FileServer;
let dir: string;
let script: string;

beforeAll(async () => {
  hangar = await serveFiles(
    (p) =>
      /^\/api\/train\/jobs\/[^/]+\/data$/.test(p) ? DATA : p === '/mirror/org/tiny/config.json' ? CONFIG : undefined,
    { requireToken: TOKEN },
  );
  registry = await serveFiles((p) => (p.endsWith('/model.safetensors') ? WEIGHTS : undefined), { refuseTokens: true });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-trainer-'));
  script = path.join(dir, 'fake-trainer.mjs');
  await fs.writeFile(script, TRAINER);
});
afterAll(async () => {
  await hangar.close();
  await registry.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const workers: TrainWorker[] = [];
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop()));
});

let n = 0;
function setup(o: Partial<TrainWorkerOptions> = {}) {
  const cp = new FakeTrainControl(hangar);
  const workDir = path.join(dir, `w${++n}`);
  const worker = new TrainWorker({
    control: cp,
    workDir,
    trainer: [process.execPath, script],
    log: createLogger('silent'),
    graceMs: 300,
    reportMs: 40,
    keepaliveMs: 150,
    retryMs: 20,
    stopReportMs: 1000,
    download: { attempts: 2, backoffMs: 10, stallMs: 5000 },
    ...o,
  });
  workers.push(worker);
  const pidFile = path.join(dir, `trainer-${n}.pid`);
  return { cp, worker, workDir, pidFile };
}

/** A claim's spec, as docs/training.md gives it; `test` steers the stand-in trainer. */
function spec(id: string, test: Record<string, unknown> = {}, over: Record<string, unknown> = {}) {
  return {
    id,
    name: `job-${id}`,
    base_repo: 'org/tiny',
    base_revision: 'main',
    params: { rank: 8, alpha: 16, dropout: 0.05, epochs: 1, lr: 0.0002, batch: 1, max_len: 64, seed: 1 },
    // Relative, as a control plane behind a proxy might send it: resolved against HANGAR_URL.
    data: { url: `/api/train/jobs/${id}/data`, sha256: sha256(DATA), bytes: DATA.length, pairs: 3 },
    base: {
      files: [
        {
          path: 'config.json',
          url: `${hangar.url}/mirror/org/tiny/config.json`,
          size: CONFIG.length,
          sha256: sha256(CONFIG),
        },
        {
          path: 'model.safetensors',
          url: `${registry.url}/org/tiny/resolve/main/model.safetensors`,
          size: WEIGHTS.length,
          sha256: null,
        },
      ],
    },
    gguf: true,
    test,
    ...over,
  };
}

async function until<T>(
  what: string,
  f: () => T | undefined | false | Promise<T | undefined | false>,
  ms = 8000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`waited ${ms} ms for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const finished = (cp: FakeTrainControl, id: string) =>
  until(`${id} to finish`, () => cp.finishes.find((f) => f.id === id));

describe('TrainWorker', () => {
  it('claims a queued job, trains it with every point reported in order, uploads the adapter and finishes DONE', async () => {
    const { cp, worker, workDir, pidFile } = setup();
    cp.pidFile = pidFile;
    cp.add('happy', spec('happy', { steps: 40, stepMs: 2, nan: true, pidFile }));
    worker.start();
    const done = await finished(cp, 'happy');
    expect(done).toMatchObject({ state: 'DONE', trainerAlive: false });
    expect(cp.claims).toEqual(['happy']);

    // Every point, once, in order, in fewer reports than points, and no two reports closer than the interval.
    const points = cp.points('happy');
    expect(points.map((p) => p.step)).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
    expect(points[0]).toEqual({ step: 1, loss: 2, lr: 0.0002, peakMiB: 1000, tokensPerSecond: 50 });
    const withPoints = cp.reports.filter((r) => r.input.points?.length);
    expect(withPoints.length).toBeLessThan(20);
    const gaps = cp.reports.slice(1).map((r, i) => r.at - cp.reports[i]!.at);
    expect(Math.min(...gaps)).toBeGreaterThanOrEqual(38);
    expect(cp.reports.find((r) => r.input.steps != null)?.input.steps).toBe(40);
    expect(cp.reports.map((r) => r.input.message).filter(Boolean)).toEqual(
      expect.arrayContaining(['fetching the training data (3 pairs)', 'training', 'uploading the adapter']),
    );

    // The trainer read the pairs and the base weights the agent fetched; a NaN loss (Python's json) is a warning.
    const events = cp.events('happy').map((e) => e.message);
    expect(events).toContain(`read 3 pairs; base llama, ${WEIGHTS.length} bytes of weights; out true`);
    expect(events).toContain('base files: config.json, model.safetensors');
    expect(events.some((e) => /^a step line without a usable step and loss: .*"step": 41, "loss": NaN/.test(e))).toBe(
      true,
    );

    // The upload is the trainer's output directory, readable by the control plane's own checker.
    expect(cp.uploads).toHaveLength(1);
    expect(cp.uploads[0]!.contents.files.map((f) => f.name).sort()).toEqual([
      'adapter_config.json',
      'adapter_model.safetensors',
    ]);
    expect(cp.uploads[0]!.contents.config).toEqual({ peft_type: 'LORA', r: 8 });

    // The node token went to Hangar (data, mirror) and never to the registry.
    expect(hangar.requests.filter((r) => r.path.includes('/happy/')).map((r) => r.auth)).toEqual([`Bearer ${TOKEN}`]);
    expect(registry.requests.every((r) => r.auth === null)).toBe(true);
    // The job's directory is gone; the base weights stay for the next job.
    await until('the job dir to be removed', async () => !(await exists(path.join(workDir, 'jobs', 'happy'))));
    expect(await fs.readFile(path.join(workDir, 'base', 'org--tiny@main', 'config.json'))).toEqual(CONFIG);
  });

  it('reuses the base weights a finished job fetched, and keeps the lease with empty reports while quiet', async () => {
    const { cp, worker } = setup({ keepaliveMs: 60 });
    cp.add('first', spec('first'));
    worker.start();
    expect((await finished(cp, 'first')).state).toBe('DONE');
    const fetched = registry.requests.length;
    cp.add('second', spec('second', { quietMs: 400 }));
    expect((await finished(cp, 'second')).state).toBe('DONE');
    expect(registry.requests.length).toBe(fetched);
    expect(cp.events('second').map((e) => e.message)).toContain(
      "base weights of org/tiny: all 2 files from this node's cache",
    );
    // 400 ms without a word from the trainer: the lease was renewed by empty reports meanwhile.
    expect(
      cp.reports.filter((r) => r.id === 'second' && Object.keys(r.input).length === 0).length,
    ).toBeGreaterThanOrEqual(2);
  });

  it("fails the job with the trainer's error message, or with the end of its stderr when it just exits", async () => {
    const { cp, worker } = setup();
    cp.add('oom', spec('oom', { fail: 'CUDA out of memory: the job needs more than the 24 GiB this GPU has' }));
    cp.add('crash', spec('crash', { crash: true }));
    worker.start();
    expect(await finished(cp, 'oom')).toMatchObject({
      state: 'FAILED',
      message: 'CUDA out of memory: the job needs more than the 24 GiB this GPU has',
    });
    const crash = await finished(cp, 'crash');
    expect(crash.state).toBe('FAILED');
    expect(crash.message).toMatch(
      /^the trainer exited with code 3 without saying done or error; the last lines it wrote to stderr:\n/,
    );
    // The last 20 lines: 11 to 30.
    expect(crash.message).toContain('stderr line 11\n');
    expect(crash.message).toMatch(/stderr line 30$/);
    expect(crash.message).not.toContain('stderr line 10\n');
    // Every stderr line is kept as an event line too.
    expect(cp.events('crash').filter((e) => e.message.startsWith('stderr line '))).toHaveLength(30);
    expect(cp.uploads).toEqual([]);
  });

  it('claims only when a GPU has the room, and trains on the GPU with the most of it, alone', async () => {
    let gpus = [
      { index: 0, name: 'H100', totalMiB: 81_559, freeMiB: 2_000 },
      { index: 1, name: 'H100', totalMiB: 81_559, freeMiB: 6_000 },
    ];
    const { cp, worker } = setup({ gpus: async () => gpus });
    const envFile = path.join(dir, 'gpu-env.txt');
    cp.add('gpu', spec('gpu', { envFile }), { gpuMiB: 30_000 });
    worker.start();
    await new Promise((r) => setTimeout(r, 300));
    expect(cp.claims).toEqual([]);
    gpus = [
      { index: 0, name: 'H100', totalMiB: 81_559, freeMiB: 40_000 },
      { index: 1, name: 'H100', totalMiB: 81_559, freeMiB: 70_000 },
    ];
    expect(await finished(cp, 'gpu')).toMatchObject({ state: 'DONE' });
    expect(await fs.readFile(envFile, 'utf8')).toBe('1');
    const said = cp.reports.flatMap((r) => r.input.events ?? []).map((e) => e.message);
    expect(said).toContain('training on GPU 1 (H100): 70000 MiB free of 81559, the job asked for 30000');
  });

  it('fails a trainer that says done without the adapter files', async () => {
    const { cp, worker } = setup();
    cp.add('empty', spec('empty', { noFiles: true }));
    worker.start();
    expect(await finished(cp, 'empty')).toMatchObject({
      state: 'FAILED',
      message:
        'the trainer said done, but its output directory lacks adapter_config.json and adapter_model.safetensors',
    });
  });

  it('cancels: SIGTERM, and CANCELLED reported only once the trainer has exited', async () => {
    const { cp, worker, pidFile } = setup();
    cp.pidFile = pidFile;
    cp.add('c1', spec('c1', { hang: true, steps: 3, pidFile }));
    worker.start();
    await until('a point', () => cp.points('c1').length === 3);
    cp.cancel('c1');
    const f = await finished(cp, 'c1');
    expect(f).toMatchObject({ state: 'CANCELLED', trainerAlive: false });
    expect(f.message).toMatch(/^cancelled: the trainer stopped on SIGTERM after \d+ ms; its GPU memory is free$/);
    expect(cp.events('c1').map((e) => e.message)).toContain('stopping on SIGTERM');
  });

  it('kills a trainer that ignores SIGTERM after the grace time', async () => {
    const { cp, worker, pidFile } = setup({ graceMs: 200 });
    cp.pidFile = pidFile;
    cp.add('stubborn', spec('stubborn', { hang: true, ignoreTerm: true, steps: 1, pidFile }));
    worker.start();
    await until('a point', () => cp.points('stubborn').length === 1);
    const asked = Date.now();
    cp.cancel('stubborn');
    const f = await finished(cp, 'stubborn');
    expect(Date.now() - asked).toBeGreaterThanOrEqual(200);
    expect(f).toMatchObject({ state: 'CANCELLED', trainerAlive: false });
    expect(f.message).toBe(
      'cancelled: the trainer was killed (SIGKILL) after the 200 ms grace time; its GPU memory is free',
    );
  });

  it('ends a RUNNING job it is not running (the agent restarted): FAILED, or CANCELLED when a cancel was asked', async () => {
    const { cp, worker } = setup();
    cp.add('lost', spec('lost'), { state: 'RUNNING' });
    cp.add('lost-cancelled', spec('lost-cancelled'), { state: 'RUNNING', cancelRequested: true });
    worker.start();
    expect(await finished(cp, 'lost')).toMatchObject({
      state: 'FAILED',
      message: 'the agent restarted (or lost the trainer) while the job was running; run it again',
    });
    expect((await finished(cp, 'lost-cancelled')).state).toBe('CANCELLED');
    expect(cp.claims).toEqual([]);
  });

  it('fails a job whose data does not match its sha256, without starting the trainer', async () => {
    const { cp, worker, pidFile } = setup();
    const bad = spec('bad', { pidFile });
    bad.data.sha256 = sha256('other data');
    cp.add('bad', bad);
    worker.start();
    const f = await finished(cp, 'bad');
    expect(f.state).toBe('FAILED');
    expect(f.message).toMatch(
      /^the training data could not be fetched: .*has sha256 [0-9a-f]{64}, but the job says [0-9a-f]{64}: the file was not kept$/,
    );
    expect(await exists(pidFile)).toBe(false);
    expect(cp.uploads).toEqual([]);
  });

  it('keeps every point while reports cannot get through, and the trainer running', async () => {
    const { cp, worker, pidFile } = setup();
    cp.add('blip', spec('blip', { steps: 30, stepMs: 3, pidFile }));
    worker.start();
    await until('the first point', () => cp.points('blip').length > 0);
    // The control plane restarts: the next reports find nobody there (40 ms, then backing off).
    cp.dropReports = 3;
    expect((await finished(cp, 'blip')).state).toBe('DONE');
    expect(cp.dropReports).toBe(0);
    expect(cp.points('blip').map((p) => p.step)).toEqual(Array.from({ length: 30 }, (_, i) => i + 1));
  });

  // A control plane back from an outage gives the node only the lost time to report again: what was kept goes as
  // soon as it answers, not when a backoff of several seconds (up to 30 s) runs out.
  it('sends the kept progress as soon as the control plane is back, not after its backoff', async () => {
    const { cp, worker } = setup({ reportMs: 1000, keepaliveMs: 60_000, retryMs: 60_000 });
    cp.away.add('report');
    cp.add('away-1', spec('away-1', { steps: 8 }));
    worker.start();
    // Tries at 0, 2 and 6 s; the next would be 8 s after the third.
    await until('three reports that found nobody', () => cp.awayTries.report >= 3, 15_000);
    expect(worker.snapshot()?.phase).toBe('uploading');
    cp.back();
    const done = await until('away-1 to finish', () => cp.finishes.find((f) => f.id === 'away-1'), 4000);
    expect(done.state).toBe('DONE');
    expect(cp.points('away-1').map((p) => p.step)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  });

  it('uploads the kept adapter and finishes as soon as the control plane is back, not after its backoff', async () => {
    const { cp, worker } = setup({ keepaliveMs: 60_000, retryMs: 60_000 });
    cp.away.add('upload');
    cp.away.add('finish');
    cp.add('away-2', spec('away-2', { steps: 3 }));
    worker.start();
    await until('an upload that found nobody', () => cp.awayTries.upload > 0);
    cp.back();
    expect((await finished(cp, 'away-2')).state).toBe('DONE');
    expect(cp.uploads.map((u) => u.id)).toEqual(['away-2']);
  });

  it('stops the trainer and drops the job when a report is refused (the job ended on the control plane)', async () => {
    const { cp, worker, pidFile, workDir } = setup();
    cp.pidFile = pidFile;
    cp.add('gone', spec('gone', { hang: true, steps: 2, pidFile }));
    worker.start();
    await until('the points', () => cp.points('gone').length === 2);
    expect(await alive(pidFile)).toBe(true);
    cp.expire('gone');
    await until('the trainer to stop', async () => !(await alive(pidFile)));
    await until('the worker to let go', () => worker.snapshot() === null);
    expect(cp.finishes).toEqual([]);
    expect(await exists(path.join(workDir, 'jobs', 'gone'))).toBe(false);
  });

  it('drops a job another runner claimed, leaves it be, and takes the next', async () => {
    const { cp, worker } = setup();
    cp.add('taken', spec('taken'), { stolen: true });
    cp.add('next', spec('next'));
    worker.start();
    expect((await finished(cp, 'next')).state).toBe('DONE');
    // "taken" is RUNNING elsewhere with this node's token: this agent neither runs nor fails it.
    expect(cp.jobs.get('taken')!.a.state).toBe('RUNNING');
    expect(cp.finishes.map((f) => f.id)).toEqual(['next']);
    expect(cp.claims).toEqual(['taken', 'next']);
  });

  it('does not finish a job whose adapter the control plane refused (it failed the job itself)', async () => {
    const { cp, worker } = setup();
    cp.uploadAnswer = { accepted: false, reason: 'adapter_model.safetensors is not a safetensors file' };
    cp.add('refused', spec('refused'));
    worker.start();
    await until('the upload', () => cp.uploads.length === 1);
    await until('the worker to let go', () => worker.snapshot() === null);
    expect(cp.finishes).toEqual([]);
  });

  it('fails the running job when the agent stops, once the trainer has exited', async () => {
    const { cp, worker, pidFile } = setup();
    cp.pidFile = pidFile;
    cp.add('bye', spec('bye', { hang: true, steps: 1, pidFile }));
    worker.start();
    await until('a point', () => cp.points('bye').length === 1);
    await worker.stop();
    expect(cp.finishes).toHaveLength(1);
    expect(cp.finishes[0]).toMatchObject({ id: 'bye', state: 'FAILED', trainerAlive: false });
    expect(cp.finishes[0]!.message).toMatch(
      /^the agent was stopped: the trainer stopped on SIGTERM after \d+ ms; its GPU memory is free; run it again$/,
    );
  });
});

describe('GraphqlTrainControl', () => {
  // Stands in for the control plane's node API: canned answers over real HTTP and a real graphql-ws server.
  let server: http.Server;
  let base: string;
  let wss: WebSocketServer;
  const seen: { auth: unknown[]; uploads: { auth?: string; type?: string; bytes: number }[]; finish: unknown[] } = {
    auth: [],
    uploads: [],
    finish: [],
  };
  const list: TrainAssignment[] = [{ id: 'j1', name: 'bot', state: 'QUEUED', gpuMiB: 4096, cancelRequested: false }];

  beforeAll(async () => {
    server = http.createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      const json = (status: number, v: unknown) =>
        res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(v));
      if (req.method === 'PUT') {
        seen.uploads.push({ auth: req.headers.authorization, type: req.headers['content-type'], bytes: body.length });
        if (req.url?.includes('/jobs/refuse/')) return json(422, { error: 'adapter_config.json is not JSON' });
        if (req.url?.includes('/jobs/down/')) return json(503, { error: 'restarting' });
        return json(200, { artifacts: [{ kind: 'peft', size: body.length, sha256: sha256(body) }] });
      }
      const { query, variables } = JSON.parse(body.toString()) as { query: string; variables: Record<string, unknown> };
      if (query.includes('claimTrainJob')) {
        if (variables.id === 'taken')
          return json(200, {
            data: { claimTrainJob: { __typename: 'ConflictError', message: 'another runner claimed the job first' } },
          });
        const good = spec('j1');
        const claimed =
          variables.id === 'bad' ? { ...good, base: { files: [{ ...good.base.files[0], path: '../escape' }] } } : good;
        return json(200, { data: { claimTrainJob: { __typename: 'TrainClaim', spec: claimed } } });
      }
      if (query.includes('reportTrainProgress')) return json(503, { error: 'restarting' });
      if (query.includes('finishTrainJob')) {
        seen.finish.push(variables);
        return json(200, { data: { finishTrainJob: { __typename: 'TrainJob' } } });
      }
      json(400, { errors: [{ message: 'unknown operation' }] });
    });
    wss = new WebSocketServer({ server, path: '/graphql' });
    // graphql-ws is loaded by Node, which resolves graphql to its CommonJS build; the schema must come from the
    // same copy, or graphql refuses it as "from another module or realm".
    const { buildSchema } = createRequire(import.meta.url)('graphql') as typeof import('graphql');
    const schema = buildSchema(`
      enum JobState { QUEUED RUNNING DONE FAILED CANCELLED }
      type TrainAssignment { id: ID! name: String! state: JobState! gpuMiB: Int! cancelRequested: Boolean! }
      type NodeTrainWork { jobs: [TrainAssignment!]! }
      type Query { ok: Boolean }
      type Subscription { nodeTrainWork: NodeTrainWork! }
    `);
    useServer(
      {
        schema,
        onConnect: (ctx) => {
          seen.auth.push(ctx.connectionParams?.authorization);
          return true;
        },
        roots: {
          subscription: {
            // As the real one does: the current list at once, then (here) nothing until the socket goes.
            nodeTrainWork: async function* () {
              yield { nodeTrainWork: { jobs: list } };
              await new Promise(() => {});
            },
          },
        },
      },
      wss,
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    for (const c of wss.clients) c.terminate();
    await new Promise((r) => wss.close(r));
    await new Promise((r) => server.close(r));
  });

  it('gets the work list on every connection, so a reconnect catches up, and says it is connected again', async () => {
    const control = new GraphqlTrainControl(base, TOKEN, { log: createLogger('silent'), reconnectMaxMs: 100 });
    const lists: TrainAssignment[][] = [];
    let reconnected = 0;
    const stop = control.work(
      (jobs) => lists.push(jobs),
      () => reconnected++,
    );
    try {
      await until('the first list', () => lists.length === 1);
      expect(lists[0]).toEqual(list);
      expect(seen.auth).toEqual([`Bearer ${TOKEN}`]);
      expect(reconnected).toBe(0);
      // The control plane restarts: every socket drops. The client reconnects and is sent the list again.
      for (const c of wss.clients) c.terminate();
      await until('the list after reconnecting', () => lists.length === 2);
      expect(lists[1]).toEqual(list);
      // What the worker sends at once, rather than at the end of its backoff (TrainWorker.controlPlaneBack).
      expect(reconnected).toBe(1);
    } finally {
      stop();
    }
    await until('the socket to close', () => wss.clients.size === 0);
  });

  it('reads the claim: the spec with its URLs resolved, a conflict, a spec it cannot read', async () => {
    const control = new GraphqlTrainControl(base, TOKEN);
    const { spec: got } = await control.claim('j1');
    expect(got.data.url).toBe(`${base}/api/train/jobs/j1/data`);
    expect(got.base.files[0]!.url).toBe(`${hangar.url}/mirror/org/tiny/config.json`);
    // Keys the agent does not know reach the trainer.
    expect((got as Record<string, unknown>).test).toEqual({});

    const conflict = await control.claim('taken').catch((e: unknown) => e);
    expect(conflict).toBeInstanceOf(ControlPlaneError);
    expect(conflict).toMatchObject({ kind: 'refused', errorType: 'ConflictError' });

    const bad = await control.claim('bad').catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(TrainSpecError);
    expect((bad as Error).message).toMatch(/base\.files\.0\.path: a relative path inside the repository/);
  });

  it('tells a control plane that is away from one that refused the adapter', async () => {
    const control = new GraphqlTrainControl(base, TOKEN);
    const report = await control.report('j1', { points: [{ step: 1, loss: 1 }] }).catch((e: unknown) => e);
    expect(report).toMatchObject({ kind: 'unreachable' });

    await control.finish('j1', 'FAILED', 'x'.repeat(3000));
    expect(seen.finish.at(-1)).toMatchObject({ id: 'j1', state: 'FAILED' });
    expect((seen.finish.at(-1) as { message: string }).message).toHaveLength(2000);

    const out = path.join(dir, 'adapter-out');
    await fs.mkdir(out, { recursive: true });
    await fs.writeFile(path.join(out, 'adapter_config.json'), '{}');
    expect(await control.upload('ok', packDirectory(out))).toMatchObject({
      accepted: true,
      artifacts: [{ kind: 'peft' }],
    });
    expect(seen.uploads[0]).toMatchObject({ auth: `Bearer ${TOKEN}`, type: 'application/gzip' });
    expect(seen.uploads[0]!.bytes).toBeGreaterThan(0);
    expect(await control.upload('refuse', packDirectory(out))).toEqual({
      accepted: false,
      reason: 'adapter_config.json is not JSON',
    });
    expect(await control.upload('down', packDirectory(out)).catch((e: unknown) => e)).toMatchObject({
      kind: 'unreachable',
    });
  });
});

describe('the agent and the real server', () => {
  // The whole contract end to end: the real control plane and PostgreSQL, the registry stand-in for the base
  // weights, the agent built as main.ts builds it (HANGAR_TRAINER), and a trainer that leaves a real PEFT adapter,
  // which the control plane checks and turns into a GGUF before it takes DONE.
  let t: TestApp;
  let hub: FakeHub;
  let url: string;
  let world: TrainingWorld;
  beforeAll(async () => {
    hub = await startFakeHub();
    t = await startTestApp({ HANGAR_HUB_URL: hub.url });
    url = await t.app.start();
    world = await trainingWorld(t, url, hub);
  });
  afterAll(async () => {
    await t?.close();
    await hub?.close();
  });

  it('claims the job it is sent, trains it, and the control plane takes the adapter and DONE', async () => {
    const adapter = await writeAdapterDir();
    const real = path.join(dir, 'real-trainer.mjs');
    await fs.writeFile(
      real,
      `import fs from 'node:fs';
import path from 'node:path';
const a = process.argv.slice(2);
const job = JSON.parse(fs.readFileSync(a[a.indexOf('--job') + 1], 'utf8'));
console.log('base files: ' + fs.readdirSync(job.base_dir).sort().join(', '));
console.log(JSON.stringify({ event: 'start', steps: 20 }));
for (let i = 1; i <= 20; i++) {
  await new Promise((r) => setTimeout(r, 5));
  console.log(JSON.stringify({ event: 'step', step: i, loss: 3 / i, lr: 0.0001, peak_mib: 900, tokens_per_s: 12.5 }));
}
for (const f of fs.readdirSync(${JSON.stringify(adapter)})) fs.copyFileSync(path.join(${JSON.stringify(adapter)}, f), path.join(job.out_dir, f));
console.log('{"event":"done"}');
`,
    );
    const agentDir = path.join(dir, 'agent');
    const config = loadAgentConfig({
      HANGAR_URL: url,
      HANGAR_NODE_TOKEN: world.nodeToken,
      HANGAR_AGENT_DIR: agentDir,
      HANGAR_AGENT_GPUS: '[{"name":"H100","totalMiB":81559,"freeMiB":20000}]',
      HANGAR_TRAINER: `${process.execPath} ${real}`,
      // After the upload the agent evaluates the adapter with llama.cpp on the CPU (train-evaluate.ts): one thread,
      // as llama.cpp's spinning threads crawl when they outnumber this machine's two cores.
      HANGAR_AGENT_THREADS: '1',
    });
    const agent = createAgent(config, {
      log: createLogger('silent'),
      // llama.cpp plays no part in training: the agent carries on without it, as on a node where it cannot run.
      runtime: () => Promise.reject(new Error('not needed here')),
    });
    const JOB = 'id state message step steps metrics { step loss } events { level message } artifacts { kind }';
    try {
      await agent.start();
      const created = await t.gql(
        'mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }',
        {
          i: {
            name: 'agent-e2e',
            model: 'tiny',
            baseRepo: BASE_REPO,
            node: 'gpu-1',
            gpuMiB: 8000,
            public: true,
            data: PAIRS,
          },
        },
        { token: world.operator },
      );
      const id = created.data?.createTrainJob.id as string;
      expect(id, JSON.stringify(created)).toBeTruthy();
      const job = await until(
        'the job to end',
        async () => {
          const j = (await t.gql(`query($id: ID!) { trainJob(id: $id) { ${JOB} } }`, { id }, { token: world.operator }))
            .data?.trainJob;
          return ['DONE', 'FAILED', 'CANCELLED'].includes(j?.state) && j;
        },
        // Training and then the evaluation against the base (base and adapter answer 21 questions each).
        90_000,
      );
      expect(job).toMatchObject({ state: 'DONE', step: 20, steps: 20 });
      expect(job.metrics.map((m: { step: number }) => m.step)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
      expect(job.artifacts.map((a: { kind: string }) => a.kind).sort()).toEqual(['gguf', 'peft']);
      const events = job.events.map((e: { message: string }) => e.message);
      expect(events).toContain('base weights of hangar-test/tiny-llama: fetched 3 files');
      expect(events.find((e: string) => e.startsWith('base files: '))).toMatch(/config\.json.*\.safetensors/);
      // Removed right after the finish: the base weights stay, the job's files go.
      await until('the job dir to go', async () => !(await exists(path.join(agentDir, 'train', 'jobs', id))));
      expect(await exists(path.join(agentDir, 'train', 'base', 'hangar-test--tiny-llama@default', 'config.json'))).toBe(
        true,
      );
    } finally {
      await agent.stop();
    }
  }, 120_000);
});

describe('agent config: the trainer', () => {
  const good = { HANGAR_URL: 'http://127.0.0.1:4000', HANGAR_NODE_TOKEN: 'hgn_abc' };
  it('defaults to the bundled train_lora.py, wherever the agent is started from', () => {
    const c = loadAgentConfig(good);
    expect(c.trainer).toEqual([
      'python3',
      path.resolve(import.meta.dirname, '../../packages/agent/trainer/train_lora.py'),
    ]);
    expect(c.trainerGraceMs).toBe(10_000);
    expect(
      loadAgentConfig({ ...good, HANGAR_TRAINER: ' /opt/venv/bin/python  /opt/train.py --bf16 ' }).trainer,
    ).toEqual(['/opt/venv/bin/python', '/opt/train.py', '--bf16']);
  });

  it('says what is wrong with HANGAR_TRAINER and HANGAR_TRAINER_GRACE_MS', () => {
    const error = (env: Record<string, string>) => {
      try {
        loadAgentConfig({ ...good, ...env });
      } catch (err) {
        expect(err).toBeInstanceOf(AgentConfigError);
        return (err as Error).message;
      }
      throw new Error('expected a config error');
    };
    expect(error({ HANGAR_TRAINER: '"/opt/my dir/train.py"' })).toMatch(
      /HANGAR_TRAINER=.* is not accepted: words split on spaces, without quotes/,
    );
    expect(error({ HANGAR_TRAINER: '   ' })).toMatch(/HANGAR_TRAINER=.* is not accepted: a command line such as/);
    expect(error({ HANGAR_TRAINER_GRACE_MS: 'soon' })).toMatch(
      /HANGAR_TRAINER_GRACE_MS="soon" is not accepted: milliseconds the trainer gets/,
    );
    expect(error({ HANGAR_TRAINER_GRACE_MS: '3600000' })).toMatch(/HANGAR_TRAINER_GRACE_MS=.*at most 600000/);
  });
});

async function exists(p: string) {
  return fs.stat(p).then(
    () => true,
    () => false,
  );
}
