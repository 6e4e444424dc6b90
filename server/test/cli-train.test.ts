import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PARAMS_EXAMPLE } from '../src/cli/train.js';
import { parseParams } from '../src/train/params.js';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, type TrainingWorld, tarOf, trainingWorld, writeAdapterDir } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// `hangar train` as a user runs it (bin/hangar.mjs, a process of its own) against a real server, with the node's
// side of a job played over the node API as the real agent speaks it: claim, progress reports, finish.

const BIN = path.resolve(import.meta.dirname, '..', 'bin', 'hangar.mjs');

let t: TestApp;
let hub: FakeHub;
let w: TrainingWorld;
let base: string;
let dir: string;

type Run = { code: number | null; stdout: string; stderr: string; proc: ChildProcess; done: Promise<Run> };

function start(args: string[]) {
  const { HANGAR_URL: _u, HANGAR_TOKEN: _t, ...inherited } = process.env;
  const proc = spawn(process.execPath, [BIN, ...args], {
    cwd: os.tmpdir(),
    env: { ...inherited, HOME: dir, HANGAR_URL: base, HANGAR_TOKEN: w.operator },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const run = { code: null, stdout: '', stderr: '', proc } as unknown as Run;
  proc.stdout?.on('data', (d) => {
    run.stdout += String(d);
  });
  proc.stderr?.on('data', (d) => {
    run.stderr += String(d);
  });
  run.done = new Promise((resolve) =>
    proc.once('exit', (code) => {
      run.code = code;
      resolve(run);
    }),
  );
  return run;
}

async function until<T>(what: string, probe: () => T | Promise<T>, timeoutMs = 30_000): Promise<NonNullable<T>> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v as NonNullable<T>;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const node = (query: string, variables: Record<string, unknown>) => t.gql(query, variables, { token: w.nodeToken });

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-cli-train-'));
  await fs.writeFile(path.join(dir, 'pairs.ndjson'), PAIRS);
  hub = await startFakeHub();
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HOST: '127.0.0.1' });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
}, 60_000);

afterAll(async () => {
  await t?.close();
  await hub?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe('hangar train', () => {
  it('creates a job and follows it to the end: steps of all, and the reason it failed with exit 1', async () => {
    const run = start([
      'train',
      'create',
      '--name',
      'cli-adapter',
      '--model',
      'tiny',
      '--base-repo',
      BASE_REPO,
      '--node',
      'gpu-1',
      '--gpu-mib',
      '8000',
      '--data',
      path.join(dir, 'pairs.ndjson'),
      '--params',
      '{"rank": 4, "epochs": 1, "batch": 4}',
      '--public',
    ]);
    const id = await until('the job to be queued', async () => {
      if (run.code !== null) throw new Error(`hangar exited ${run.code}: ${run.stderr}`);
      return run.stderr.match(/training job (\S+) queued on gpu-1/)?.[1];
    });
    // The node's side: it claims the job, reports steps, and finishes.
    const claim = await node('mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on Error { message } } }', {
      id,
    });
    expect(claim.data?.claimTrainJob.__typename).toBe('TrainClaim');
    const REPORT = `mutation($id: ID!, $input: TrainProgressInput!) { reportTrainProgress(id: $id, input: $input) { __typename ... on Error { message } } }`;
    for (const step of [1, 2, 3]) {
      const r = await node(REPORT, { id, input: { steps: 3, points: [{ step, loss: 2 - step / 2 }] } });
      expect(r.data?.reportTrainProgress.__typename, JSON.stringify(r)).toBe('TrainJob');
      await new Promise((r) => setTimeout(r, 300));
    }
    // Finished FAILED: DONE would need the adapter uploaded first, which is the trainer's part, not the CLI's.
    const finished = await node(
      'mutation($id: ID!) { finishTrainJob(id: $id, state: FAILED, message: "CUDA out of memory at step 3") { __typename ... on Error { message } } }',
      { id },
    );
    expect(finished.data?.finishTrainJob.__typename, JSON.stringify(finished.data)).toBe('TrainJob');
    const r = await run.done;
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/cli-adapter +\[[█░]+\] +100% +3 of 3/);
    expect(r.stderr).toContain('cli-adapter failed: CUDA out of memory at step 3\n');

    const ls = start(['--json', 'train', 'ls']);
    const listed = await ls.done;
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toEqual([
      expect.objectContaining({ id, name: 'cli-adapter', state: 'FAILED', step: 3, steps: 3 }),
    ]);
  }, 120_000);

  it("the help's --params example is one the server accepts (it once named a setting the trainer has not)", () => {
    expect(parseParams(JSON.parse(PARAMS_EXAMPLE))).toMatchObject({ ok: true });
  });

  it('--no-gguf queues a job that makes only the PEFT adapter; without it the server decides', async () => {
    const args = (name: string) => [
      '--json',
      'train',
      'create',
      '--name',
      name,
      '--model',
      'tiny',
      '--base-repo',
      BASE_REPO,
      '--node',
      'gpu-1',
      '--gpu-mib',
      '8000',
      '--data',
      path.join(dir, 'pairs.ndjson'),
      '--public',
      '--no-wait',
    ];
    const off = await start([...args('peft-only'), '--no-gguf']).done;
    const on = await start(args('both-kinds')).done;
    expect(off.code, off.stderr).toBe(0);
    expect(on.code, on.stderr).toBe(0);
    const gguf = async (name: string) => (await t.app.db.prisma.trainJob.findFirstOrThrow({ where: { name } })).gguf;
    expect(await gguf('peft-only')).toBe(false);
    // tiny is served by llama.cpp, so the server's default makes the GGUF adapter too.
    expect(await gguf('both-kinds')).toBe(true);
    for (const name of ['peft-only', 'both-kinds']) {
      const job = await t.app.db.prisma.trainJob.findFirstOrThrow({ where: { name } });
      await t.gql(
        'mutation($id: ID!) { cancelTrainJob(id: $id) { __typename } }',
        { id: job.id },
        { token: w.operator },
      );
    }
  }, 60_000);

  it('downloads what a finished job made, verified by its sha256, and refuses an unknown kind', async () => {
    const created = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name: 'to-download',
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 8000,
          public: true,
          data: PAIRS,
        },
      },
      { token: w.operator },
    );
    const id = created.data?.createTrainJob.id as string;
    expect(id, JSON.stringify(created)).toBeTruthy();
    await node('mutation($id: ID!) { claimTrainJob(id: $id) { __typename } }', { id });
    const tar = new Uint8Array(await tarOf(await writeAdapterDir()));
    const up = await fetch(`${base}/api/train/jobs/${id}/artifacts/peft`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${w.nodeToken}`, 'content-type': 'application/gzip' },
      body: tar,
    });
    expect(up.status).toBe(200);
    await node('mutation($id: ID!) { finishTrainJob(id: $id, state: DONE) { __typename } }', { id });

    const out = await fs.mkdtemp(path.join(dir, 'dl-'));
    const peft = await start(['--json', 'train', 'download', id, '--kind', 'peft', '--out', out]).done;
    expect(peft.code, peft.stderr).toBe(0);
    const got = JSON.parse(peft.stdout) as { file: string; sha256: string; bytes: number };
    const bytes = await fs.readFile(got.file);
    expect(path.dirname(got.file)).toBe(out);
    expect(got.sha256).toBe(createHash('sha256').update(bytes).digest('hex'));
    expect(Buffer.compare(bytes, Buffer.from(tar))).toBe(0);

    const gguf = await start(['train', 'download', id, '--out', path.join(out, 'adapter.gguf')]).done;
    expect(gguf.code, gguf.stderr).toBe(0);
    const head = (await fs.readFile(path.join(out, 'adapter.gguf'))).subarray(0, 4).toString('latin1');
    expect(head).toBe('GGUF');
    // Nothing half-written is left beside them.
    expect((await fs.readdir(out)).filter((f) => f.endsWith('.part'))).toEqual([]);

    const bad = await start(['train', 'download', id, '--kind', 'onnx']).done;
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe('hangar: --kind is peft or gguf: "onnx" is not\n');
  }, 60_000);

  it('--eval-share, --eval-seed and --eval-data set what is held out for the evaluation, and bad ones are refused', async () => {
    const many = Array.from({ length: 60 }, (_, i) => JSON.stringify({ q: `What is ${i} times 3?`, a: `${3 * i}` }));
    await fs.writeFile(path.join(dir, 'many.ndjson'), many.join('\n'));
    await fs.writeFile(path.join(dir, 'eval.ndjson'), many.slice(0, 6).join('\n'));
    const args = (name: string, ...more: string[]) => [
      '--json',
      'train',
      'create',
      '--name',
      name,
      '--model',
      'tiny',
      '--base-repo',
      BASE_REPO,
      '--node',
      'gpu-1',
      '--gpu-mib',
      '8000',
      '--data',
      path.join(dir, 'many.ndjson'),
      '--public',
      '--no-wait',
      ...more,
    ];
    const shared = await start(args('eval-share', '--eval-share', '40%', '--eval-seed', '7')).done;
    expect(shared.code, shared.stderr).toBe(0);
    const fraction = await start(args('eval-fraction', '--eval-share', '0.2')).done;
    expect(fraction.code, fraction.stderr).toBe(0);
    const file = await start(args('eval-file', '--eval-data', path.join(dir, 'eval.ndjson'))).done;
    expect(file.code, file.stderr).toBe(0);
    const job = (name: string) => t.app.db.prisma.trainJob.findFirstOrThrow({ where: { name } });
    // 40 % of 60 questions, picked by seed 7; not the default 10 %.
    expect(await job('eval-share')).toMatchObject({ evalShare: 0.4, evalSeed: 7 });
    expect((await job('eval-share')).heldOutLines).toHaveLength(24);
    expect((await job('eval-fraction')).heldOutLines).toHaveLength(12);
    // An evaluation file: nothing of --data is held out, the file is kept by its sha256.
    const withFile = await job('eval-file');
    expect(withFile.heldOutLines).toEqual([]);
    expect(withFile.evalDataSha256).toBe(createHash('sha256').update(many.slice(0, 6).join('\n')).digest('hex'));

    const both = await start(args('eval-both', '--eval-share', '20%', '--eval-data', path.join(dir, 'eval.ndjson')))
      .done;
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('give either an evaluation file (evalData) or a share of the pairs to hold out');
    const over = await start(args('eval-over', '--eval-share', '60%')).done;
    expect(over.code).toBe(2);
    expect(over.stderr).toContain('at most 0.5');
    const words = await start(args('eval-words', '--eval-share', 'ten')).done;
    expect(words.code).toBe(2);
    expect(words.stderr).toBe('hangar: --eval-share is a share such as 10% or 0.1: ten is not\n');
    const seed = await start(args('eval-seed', '--eval-seed', '1.5')).done;
    expect(seed.code).toBe(2);
    expect(seed.stderr).toBe('hangar: --eval-seed is a whole number, such as 42: 1.5 is not\n');
    for (const name of ['eval-share', 'eval-fraction', 'eval-file']) {
      await t.gql(
        'mutation($id: ID!) { cancelTrainJob(id: $id) { __typename } }',
        { id: (await job(name)).id },
        {
          token: w.operator,
        },
      );
    }
  }, 90_000);

  it('refuses a job for a node that does not exist, naming it, with exit 2', async () => {
    const r = await start([
      'train',
      'create',
      '--name',
      'nowhere',
      '--model',
      'tiny',
      '--base-repo',
      BASE_REPO,
      '--node',
      'no-such-node',
      '--gpu-mib',
      '8000',
      '--data',
      path.join(dir, 'pairs.ndjson'),
    ]).done;
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toBe('hangar: no node no-such-node: name a node that reports to Hangar (see Nodes)\n');
  }, 60_000);
});
