import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApp } from '../src/app.js';
import { ConfigError, loadConfig } from '../src/config.js';
import { GENERAL_QUESTIONS } from '../src/train/general-questions.js';
import { type FakeHub, startFakeHub } from './fixtures/fake-hub.js';
import { BASE_REPO, PAIRS, type TrainingWorld, trainingWorld } from './fixtures/training.js';
import { startTestApp, type TestApp } from './harness.js';

// The operator's own general questions (#32): hangar.yaml's `training.generalQuestions` names an NDJSON file that
// replaces Hangar's 16 in every job's evaluation (the claim's spec carries them to the node, which has both models
// answer them), and a bad file stops the start, saying which file and line.

const SITE = [
  { q: 'Which port does our gateway listen on?', a: '8443' },
  { q: 'What is the name of our on-call rota tool?', a: 'Pager' },
  { q: 'In which city is our main office?', a: 'Lyon' },
  { q: 'What language are our runbooks written in?', a: 'French' },
  { q: 'How many regions do we run in?', a: 'Three' },
  { q: 'What is our ticket prefix?', a: 'OPS' },
];

let t: TestApp;
let hub: FakeHub;
let dir: string;
let site: string;
let w: TrainingWorld;

beforeAll(async () => {
  hub = await startFakeHub();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-site-questions-'));
  site = path.join(dir, 'hangar.yaml');
  await fs.mkdir(path.join(dir, 'eval'));
  await fs.writeFile(path.join(dir, 'eval', 'general.ndjson'), `${SITE.map((p) => JSON.stringify(p)).join('\n')}\n`);
  // Relative to hangar.yaml, not to the server's working directory.
  await fs.writeFile(site, 'training:\n  publishRequires: NOT_WORSE\n  generalQuestions: eval/general.ndjson\n');
  t = await startTestApp({ HANGAR_HUB_URL: hub.url, HANGAR_CONFIG: site });
  const base = await t.app.start();
  w = await trainingWorld(t, base, hub);
});
afterAll(async () => {
  await t.close();
  await hub.close();
  await fs.rm(dir, { recursive: true, force: true });
});

describe("the site's general questions (hangar.yaml training.generalQuestions)", () => {
  it("replace Hangar's in the evaluation a node is given with a job", async () => {
    const r = await t.gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id heldOut } ... on Error { message } } }`,
      {
        i: {
          name: 'site-questions',
          model: 'tiny',
          baseRepo: BASE_REPO,
          node: 'gpu-1',
          gpuMiB: 4000,
          public: true,
          data: PAIRS,
          params: { batch: 1, epochs: 1, rank: 4 },
        },
      },
      { token: w.operator },
    );
    expect(r.data?.createTrainJob).toMatchObject({ __typename: 'TrainJob', heldOut: 5 });
    const claim = await t.gql(
      'mutation($id: ID!) { claimTrainJob(id: $id) { __typename ... on TrainClaim { spec } ... on Error { message } } }',
      { id: r.data?.createTrainJob.id },
      { token: w.nodeToken },
    );
    expect(claim.data?.claimTrainJob.__typename).toBe('TrainClaim');
    const spec = claim.data?.claimTrainJob.spec as { eval: { general: { q: string; a: string }[]; pairs: unknown[] } };
    expect(spec.eval.general).toEqual(SITE);
    expect(spec.eval.general).not.toContainEqual(GENERAL_QUESTIONS[0]);
    expect(spec.eval.pairs).toHaveLength(5);
  });

  it('stop the start when the file is missing, has a bad line, or holds too few questions, naming file and line', async () => {
    const bad = path.join(dir, 'bad.yaml');
    const questions = path.join(dir, 'bad.ndjson');
    const config = loadConfig({
      HANGAR_DATA_DIR: t.dataDir,
      HANGAR_CONFIG: bad,
      HANGAR_LOG_LEVEL: 'silent',
      PORT: '0',
    });
    const start = () =>
      createApp({ config, log: createLogger('silent'), database: t.app.db, print: () => {} }).then(
        async (app) => {
          await app.stop();
          return null;
        },
        (e: unknown) => e as Error,
      );

    await fs.writeFile(bad, 'models: []\ntraining:\n  generalQuestions: nowhere.ndjson\n');
    let failed = await start();
    expect(failed).toBeInstanceOf(ConfigError);
    expect(failed?.message).toBe(
      `HANGAR_CONFIG=${bad}, line 3 (training.generalQuestions): cannot read ${path.join(dir, 'nowhere.ndjson')} (ENOENT): fix the path`,
    );

    await fs.writeFile(bad, 'training:\n  generalQuestions: bad.ndjson\n');
    const lines = SITE.map((p) => JSON.stringify(p));
    lines[2] = '{"q": "What is missing here?"}';
    await fs.writeFile(questions, lines.join('\n'));
    failed = await start();
    expect(failed?.message).toBe(
      `HANGAR_CONFIG=${bad}, line 2 (training.generalQuestions): ${questions}, line 3: needs "q" and "a", both strings`,
    );

    await fs.writeFile(questions, lines.slice(0, 2).join('\n'));
    failed = await start();
    expect(failed?.message).toBe(
      `HANGAR_CONFIG=${bad}, line 2 (training.generalQuestions): ${questions} has 2 distinct questions; 5 to 200 are accepted (each is answered twice on the node after training)`,
    );

    await fs.writeFile(bad, 'training:\n  generalQuestions: [1, 2]\n');
    failed = await start();
    expect(failed?.message).toBe(
      `HANGAR_CONFIG=${bad}, line 2 (training.generalQuestions): the path of an NDJSON file of {"q": "…", "a": "…"}, relative to hangar.yaml`,
    );
  });
});
