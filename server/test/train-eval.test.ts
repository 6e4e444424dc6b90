import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Agent, createAgent } from '@hangar/agent/agent';
import { loadAgentConfig } from '@hangar/agent/config';
import { createLogger } from '@hangar/common/log';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type AnsweredQuestion, evaluate } from '../src/train/eval-score.js';
import { GENERAL_QUESTIONS } from '../src/train/general-questions.js';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// A job's evaluation against its base, end to end (#32): the real agent, the stand-in trainer (fixtures/
// stand-in-trainer.mjs, which records what it was given), and real llama.cpp (node-llama-cpp on the CPU) running
// the tiny llama GGUF as the base and with the job's GGUF adapter, as the node's replicas would.

const TRAINER = new URL('./fixtures/stand-in-trainer.mjs', import.meta.url).pathname;
/** Stands in for `vllm serve` (it speaks vLLM's /tokenize, /v1/completions and prompt_logprobs: see the file). */
const STAND_IN_VLLM = fileURLToPath(new URL('../../packages/agent/test/fixtures/stand-in-engine.mjs', import.meta.url));

let t: TestApp;
let hub: FakeHub;
/** The site's hangar.yaml: read at each publish for `training.publishRequires`. */
let siteFile: string;
let base: string;
let w: TrainingWorld;
const agents: Agent[] = [];
const dirs: string[] = [];

beforeAll(async () => {
  hub = await startFakeHub();
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-eval-site-'));
  dirs.push(dir);
  siteFile = path.join(dir, 'hangar.yaml');
  await fs.writeFile(siteFile, 'training:\n  publishRequires: NOT_WORSE\n');
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_CONFIG: siteFile });
  base = await t.app.start();
  w = await trainingWorld(t, base, hub);
});
afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.stop()));
  delete process.env.HANGAR_STAND_IN_RECORD;
  delete process.env.HANGAR_STAND_IN_B_SCALE;
});
afterAll(async () => {
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
  await t.close();
  await hub.close();
});

/** Pairs a person can read: "What is the code word for item i?" → "word i". */
const pairs = (n: number) =>
  Array.from({ length: n }, (_, i) =>
    JSON.stringify({ q: `What is the code word for item ${i}?`, a: `word ${i}` }),
  ).join('\n');

/** Runs one job through a real agent (llama.cpp on the CPU evaluates it) and returns its id, DONE. */
async function trainOne(n: number, env: { bScale?: number; model?: string; vllm?: boolean } = {}) {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-eval-'));
  dirs.push(dir);
  const record = path.join(dir, 'record.json');
  // The trainer is the agent's child: it inherits these.
  process.env.HANGAR_STAND_IN_RECORD = record;
  process.env.HANGAR_STAND_IN_STEP_MS = '5';
  if (env.bScale != null) process.env.HANGAR_STAND_IN_B_SCALE = String(env.bScale);
  const agent = createAgent(
    loadAgentConfig({
      HANGAR_URL: base,
      HANGAR_NODE_TOKEN: w.nodeToken,
      HANGAR_AGENT_DIR: path.join(dir, 'agent'),
      HANGAR_AGENT_GPUS: JSON.stringify([{ name: 'H100', totalMiB: 81559, freeMiB: 20000 }]),
      HANGAR_AGENT_HEARTBEAT_MS: '500',
      HANGAR_AGENT_THREADS: '1',
      HANGAR_TRAINER: `${process.execPath} ${TRAINER}`,
      HANGAR_LOG_LEVEL: 'silent',
      ...(env.vllm ? { HANGAR_AGENT_VLLM_COMMAND: `${process.execPath} ${STAND_IN_VLLM} serve` } : {}),
    }),
    { log: createLogger('silent'), runtime: () => Promise.reject(new Error('no replicas here: this node trains')) },
  );
  agents.push(agent);
  await agent.start();
  const r = await t.gql(
    `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id heldOut } ... on Error { message } } }`,
    {
      i: {
        name: `eval-${Math.random().toString(36).slice(2, 8)}`,
        model: env.model ?? 'tiny',
        baseRepo: BASE_REPO,
        node: 'gpu-1',
        gpuMiB: 4000,
        public: true,
        data: pairs(n),
        params: { batch: 1, epochs: 1, rank: 4 },
      },
    },
    { token: w.operator },
  );
  expect(r.data?.createTrainJob.__typename).toBe('TrainJob');
  const id = r.data?.createTrainJob.id as string;
  for (const end = Date.now() + 120_000; ; ) {
    const j = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });
    if (j.state === 'DONE') break;
    if (j.state !== 'QUEUED' && j.state !== 'RUNNING') throw new Error(`the job ended ${j.state}: ${j.message}`);
    if (Date.now() > end) throw new Error(`the job is still ${j.state}: ${j.message}`);
    await new Promise((res) => setTimeout(res, 100));
  }
  await agent.stop();
  agents.splice(agents.indexOf(agent), 1);
  // Every job here is evaluated: when one is not, its events say why (a failure here shows them).
  if (!(await t.app.db.prisma.trainEvaluation.findUnique({ where: { jobId: id } }))) {
    const events = await t.app.db.prisma.trainEvent.findMany({ where: { jobId: id }, orderBy: { at: 'asc' } });
    throw new Error(`job ${id} was not evaluated:\n${events.map((e) => `${e.level} ${e.message}`).join('\n')}`);
  }
  return { id, record: JSON.parse(await fs.readFile(record, 'utf8')) as { trained: string[]; evaluated: string[] } };
}

const EVALUATION = `
  query($id: ID!) { trainJob(id: $id) {
    heldOut
    metrics { step loss evalLoss }
    evaluation {
      heldOut verdict forgettingVerdict
      metrics { set name base adapter difference low high }
      questions { set question reference baseAnswer adapterAnswer }
    }
  } }`;

describe('choosing the held-out pairs', () => {
  const create = async (extra: Record<string, unknown>) =>
    (
      await t.gql(
        `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id heldOut events { message } } ... on Error { message } ... on ValidationError { field } } }`,
        {
          i: {
            name: `choose-${Math.random().toString(36).slice(2, 8)}`,
            model: 'tiny',
            baseRepo: BASE_REPO,
            node: 'gpu-1',
            gpuMiB: 4000,
            public: true,
            data: pairs(100),
            ...extra,
          },
        },
        { token: w.operator },
      )
    ).data?.createTrainJob;

  // These jobs are only looked at: cancelled before the next tests' agent would train them.
  afterAll(async () => {
    await t.app.db.prisma.trainJob.updateMany({ where: { state: 'QUEUED' }, data: { state: 'CANCELLED' } });
  });

  it('holds out the share asked for by the seed given, records both, and takes an evaluation file instead', async () => {
    const a = await create({ evalShare: 0.2, evalSeed: 7 });
    expect(a).toMatchObject({ __typename: 'TrainJob', heldOut: 20 });
    expect(a.events.map((e: { message: string }) => e.message)).toContain(
      '20 of 100 pairs held out to evaluate the adapter (never trained on; picked by seed 7); 80 trained on',
    );
    const again = await t.app.db.prisma.trainJob.findUniqueOrThrow({
      where: { id: (await create({ evalShare: 0.2, evalSeed: 7 })).id },
    });
    expect(again.heldOutLines).toEqual(
      (await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id: a.id } })).heldOutLines,
    );

    const file = await create({ evalData: pairs(6) });
    expect(file).toMatchObject({ __typename: 'TrainJob', heldOut: 0 });
    expect(file.events.map((e: { message: string }) => e.message).join('\n')).toContain(
      'evaluated on the evaluation file',
    );
  });

  it('refuses a share over half, and a file and a share together, naming the field', async () => {
    expect(await create({ evalShare: 0.8 })).toMatchObject({ __typename: 'ValidationError', field: 'evalShare' });
    expect(await create({ evalShare: 0.2, evalData: pairs(6) })).toMatchObject({
      __typename: 'ValidationError',
      field: 'evalShare',
    });
  });
});

describe('a job evaluated against its base on the node', () => {
  it('holds out pairs the trainer never trains on, charts their loss, and has base and adapter answer every one', async () => {
    const { id, record } = await trainOne(30);
    const job = await t.app.db.prisma.trainJob.findUniqueOrThrow({ where: { id } });
    // 10 % of 30 is 3; at least a handful (5) are held out, picked by the recorded seed.
    expect(job.heldOutLines).toHaveLength(5);
    expect(job.evalSeed).toBe(42);
    const heldOut = job.heldOutLines.map((l) => `What is the code word for item ${l - 1}?`);
    expect(record.trained).toHaveLength(25);
    for (const q of heldOut) expect(record.trained).not.toContain(q);
    expect(record.evaluated.sort()).toEqual([...heldOut].sort());

    const r = await t.gql(EVALUATION, { id }, { token: w.operator });
    const tj = r.data?.trainJob;
    expect(tj.heldOut).toBe(5);
    // The held-out loss next to the training loss, at the steps the trainer evaluated.
    const evaluated = tj.metrics.filter((m: { evalLoss: number | null }) => m.evalLoss !== null);
    expect(evaluated.length).toBeGreaterThanOrEqual(5);
    expect(evaluated.every((m: { loss: number }) => typeof m.loss === 'number')).toBe(true);

    const ev = tj.evaluation;
    expect(ev.heldOut).toBe(5);
    // Every held-out question and every general one, answered by both models.
    expect(
      ev.questions
        .filter((q: { set: string }) => q.set === 'pairs')
        .map((q: { question: string }) => q.question)
        .sort(),
    ).toEqual([...heldOut].sort());
    expect(ev.questions.filter((q: { set: string }) => q.set === 'general')).toHaveLength(GENERAL_QUESTIONS.length);
    for (const q of ev.questions) {
      expect(typeof q.baseAnswer).toBe('string');
      expect(typeof q.adapterAnswer).toBe('string');
    }
    // The adapter changes what the model says (the stand-in's B is non-zero), so the answers are two models'.
    expect(
      ev.questions.some((q: { baseAnswer: string; adapterAnswer: string }) => q.baseAnswer !== q.adapterAnswer),
    ).toBe(true);
    expect(ev.metrics.map((m: { set: string; name: string }) => `${m.set}.${m.name}`)).toEqual([
      'pairs.tokenF1',
      'pairs.exactMatch',
      'pairs.rougeL',
      'pairs.logLikelihood',
      'pairs.perplexity',
      'general.tokenF1',
      'general.exactMatch',
      'general.rougeL',
      'general.logLikelihood',
      'general.perplexity',
    ]);
    for (const m of ev.metrics) {
      expect(m.difference).toBeCloseTo(m.adapter - m.base, 9);
      expect(m.low).toBeLessThanOrEqual(m.high);
    }
    expect(['BETTER', 'WORSE', 'NO_CLEAR_DIFFERENCE']).toContain(ev.verdict);

    // The scores come from the answers: the stored answers with one adapter answer made right score higher.
    const stored = (await t.app.db.prisma.trainEvaluation.findUniqueOrThrow({ where: { jobId: id } }))
      .questions as AnsweredQuestion[];
    const f1 = (qs: AnsweredQuestion[]) =>
      evaluate(qs, 42).metrics.find((m) => m.set === 'pairs' && m.name === 'tokenF1')?.adapter ?? Number.NaN;
    const first = stored.findIndex((q) => q.set === 'pairs');
    const changed = stored.map((q, i) => (i === first ? { ...q, adapterAnswer: q.reference } : q));
    expect(f1(stored)).toBeCloseTo(ev.metrics[0].adapter, 9);
    expect(f1(changed)).toBeGreaterThan(f1(stored));
  }, 180_000);

  it('refuses to publish an adapter clearly worse than its base, saying which and by how much; force and a reason publish it, audited', async () => {
    // A diverged run: B's values near 1e30, so what the adapter adds overflows and the model it is applied to says
    // nothing sensible. (A merely large random B cannot do it here: the tiny llama's final norm and random head keep
    // it near uniform whatever the adapter adds.)
    const { id } = await trainOne(30, { bScale: 1e30 });
    const ev = await t.app.db.prisma.trainEvaluation.findUniqueOrThrow({ where: { jobId: id } });
    expect(ev.verdict, JSON.stringify(ev.metrics)).toBe('WORSE');

    const publish = (extra = '') =>
      t.gql(
        `mutation($id: ID!) { publishTrainJob(id: $id${extra}) { __typename ... on TrainJobPublished { adapter } ... on Error { message } } }`,
        { id },
        { token: w.operator },
      );
    const refused = (await publish()).data?.publishTrainJob;
    expect(refused.__typename).toBe('ConflictError');
    expect(refused.message).toMatch(
      /on its 5 held-out pairs the adapter is WORSE than its base: .*log-likelihood per token of the reference -?[\d.]+ → -?[\d.]+ \(-[\d.]+, 95 % CI/,
    );
    expect(refused.message).toContain('force: true and a reason');
    expect(await t.app.db.prisma.adapter.count({ where: { trainJobId: id } })).toBe(0);

    const noReason = (await publish(', force: true')).data?.publishTrainJob;
    expect(noReason).toMatchObject({ __typename: 'ValidationError' });
    expect(noReason.message).toContain('needs a reason');

    const forced = (await publish(', force: true, reason: "the team accepts it for the demo"')).data?.publishTrainJob;
    expect(forced.__typename).toBe('TrainJobPublished');
    const audit = await t.app.db.prisma.auditEvent.findFirstOrThrow({
      where: { action: 'publishTrainJob', target: forced.adapter, outcome: 'DONE' },
    });
    expect(audit.message).toContain('evaluation: pairs WORSE');
    expect(audit.message).toContain('published with force past');
    expect(audit.message).toContain('reason: the team accepts it for the demo');

    // The published adapter keeps its evaluation: on the model, and after its job is deleted.
    const del = await t.gql(
      'mutation($id: ID!) { deleteTrainJob(id: $id) { __typename ... on Error { message } } }',
      { id },
      { token: w.operator },
    );
    expect(del.data?.deleteTrainJob.__typename).toBe('DeletedTrainJob');
    const model = await t.gql(
      'query { model(name: "tiny") { adapters { name evaluation { verdict heldOut } } } }',
      {},
      { token: w.operator },
    );
    expect(model.data?.model.adapters).toContainEqual({
      name: forced.adapter,
      evaluation: { verdict: 'WORSE', heldOut: 5 },
    });
  }, 180_000);

  it('says INSUFFICIENT_DATA for a job with too few pairs to judge', async () => {
    const { id, record } = await trainOne(6);
    // Half of 6 at most: 3 held out, 3 trained on.
    expect(record.trained).toHaveLength(3);
    const r = await t.gql(EVALUATION, { id }, { token: w.operator });
    expect(r.data?.trainJob.evaluation).toMatchObject({ heldOut: 3, verdict: 'INSUFFICIENT_DATA' });
    expect(r.data?.trainJob.evaluation.forgettingVerdict).not.toBe('INSUFFICIENT_DATA');

    // A site that publishes only adapters shown BETTER refuses it; the default (not WORSE) publishes it.
    const publish = async () =>
      (
        await t.gql(
          'mutation($id: ID!) { publishTrainJob(id: $id) { __typename ... on Error { message } } }',
          { id },
          { token: w.operator },
        )
      ).data?.publishTrainJob;
    await fs.writeFile(siteFile, 'training:\n  publishRequires: BETTER\n');
    const strict = await publish();
    expect(strict.__typename).toBe('ConflictError');
    expect(strict.message).toContain(
      'on its held-out pairs the verdict is INSUFFICIENT_DATA, and this site publishes only adapters evaluated BETTER',
    );
    await fs.writeFile(siteFile, 'training:\n  publishRequires: NOT_WORSE\n');
    expect((await publish()).__typename).toBe('TrainJobPublished');
  }, 180_000);
});

describe("a vLLM model's job, evaluated on vLLM with its PEFT adapter", () => {
  beforeAll(async () => {
    // Stopped: no replica is placed, the node only trains. Its weights are the base repository the job trains from.
    await t.app.db.prisma.catalogModel.create({
      data: {
        name: 'tiny-vllm',
        source: `${base}/mirror/tiny-vllm/v1/`,
        engine: 'vllm',
        minReplicas: 0,
        maxReplicas: 0,
      },
    });
  });
  afterEach(() => {
    delete process.env.HANGAR_STAND_IN_ENGINE_RECORD;
  });

  type Asked = {
    model: string;
    prompt: number[];
    max_tokens: number;
    temperature: number;
    seed?: number;
    prompt_logprobs?: number;
  };
  const recording = async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-train-eval-vllm-'));
    dirs.push(dir);
    const file = path.join(dir, 'asked.ndjson');
    // vLLM is the agent's child: it inherits this.
    process.env.HANGAR_STAND_IN_ENGINE_RECORD = file;
    return async () =>
      (await fs.readFile(file, 'utf8'))
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Asked);
  };

  it('has the base and the adapter answer every question greedily with the seed, scores prompt_logprobs, and gives a verdict', async () => {
    const asked = await recording();
    const { id } = await trainOne(30, { model: 'tiny-vllm', vllm: true });
    const tj = (await t.gql(EVALUATION, { id }, { token: w.operator })).data?.trainJob;
    const ev = tj.evaluation;
    expect(ev.heldOut).toBe(5);
    expect(['BETTER', 'WORSE', 'NO_CLEAR_DIFFERENCE']).toContain(ev.verdict);
    expect(ev.questions).toHaveLength(5 + GENERAL_QUESTIONS.length);
    // Answered by vLLM: the base model, and the adapter as its LoRA module (the stand-in says which answered).
    for (const q of ev.questions) {
      expect(q.baseAnswer).toMatch(/^stand-in vllm model=evaluated-base adapter=none/);
      expect(q.adapterAnswer).toMatch(/^stand-in vllm model=evaluated-base adapter=evaluated-adapter/);
    }
    // The log-likelihood is vLLM's: -2 per token under the toy base, a little less under a sane adapter.
    const ll = ev.metrics.find((m: { set: string; name: string }) => m.set === 'pairs' && m.name === 'logLikelihood');
    expect(ll.base).toBeCloseTo(-2, 9);
    expect(ll.adapter).toBeLessThan(-2);
    expect(ll.adapter).toBeGreaterThan(-2.1);

    // Every question twice per model: a greedy answer with the job's seed, and the reference scored by
    // prompt_logprobs over the same prompt followed by the reference.
    const requests = await asked();
    const questions = ev.questions.length;
    for (const model of ['evaluated-base', 'evaluated-adapter']) {
      const answers = requests.filter((r) => r.model === model && r.prompt_logprobs === undefined);
      const scored = requests.filter((r) => r.model === model && r.prompt_logprobs === 0);
      expect(answers).toHaveLength(questions);
      expect(scored).toHaveLength(questions);
      for (const r of answers) expect(r).toMatchObject({ temperature: 0, seed: 42, max_tokens: 48 });
      for (const [i, r] of scored.entries()) {
        expect(r.prompt.slice(0, answers[i]?.prompt.length)).toEqual(answers[i]?.prompt);
        expect(r.prompt.length).toBeGreaterThan(answers[i]?.prompt.length ?? 0);
      }
    }
  }, 180_000);

  it('refuses to publish a diverged PEFT adapter as WORSE, and publishes it with force and a reason', async () => {
    const { id } = await trainOne(30, { model: 'tiny-vllm', vllm: true, bScale: 1e30 });
    const ev = await t.app.db.prisma.trainEvaluation.findUniqueOrThrow({ where: { jobId: id } });
    expect(ev.verdict, JSON.stringify(ev.metrics)).toBe('WORSE');
    const publish = (extra = '') =>
      t.gql(
        `mutation($id: ID!) { publishTrainJob(id: $id${extra}) { __typename ... on TrainJobPublished { adapter } ... on Error { message } } }`,
        { id },
        { token: w.operator },
      );
    const refused = (await publish()).data?.publishTrainJob;
    expect(refused.__typename).toBe('ConflictError');
    expect(refused.message).toMatch(/on its 5 held-out pairs the adapter is WORSE than its base/);
    const forced = (await publish(', force: true, reason: "checked by hand"')).data?.publishTrainJob;
    expect(forced.__typename, JSON.stringify(forced)).toBe('TrainJobPublished');
  }, 180_000);
});
