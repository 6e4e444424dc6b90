import path from 'node:path';
import { expect, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, overflows, signIn, snap } from '../fixtures/hangar.js';
import { trainBaseRepo } from '../fixtures/stand-in-hub.js';

// A job's evaluation against its base on its page (#32): submitted by a script, trained by a real node agent with
// the stand-in trainer (server/test/fixtures/stand-in-trainer.mjs: this machine has no GPU), then evaluated on
// the node by real llama.cpp on the tiny llama, base and base + adapter. The page shows the verdicts, the
// measures with their intervals, the questions side by side, and the held-out loss beside the training loss.

const NODE = 'e2e-evaluator';
const MODEL = 'e2e-eval-base';
const JOB = 'e2e-eval-tone';

let agent: RunningAgent | undefined;

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

test("a finished job's page compares its adapter with the base, question by question", async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(240_000);
  const { gql } = await adminApi(request);
  const nodeToken = (await gql(`mutation { createNode(name: "${NODE}") { ... on CreatedNode { token } } }`)).data
    .createNode.token as string;
  const secret = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-eval", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put(`/mirror/${MODEL}/v1/tiny-llama.gguf`, {
    headers: { authorization: `Bearer ${secret}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  expect(
    (
      await gql(
        `mutation { serveMirrorVersion(model: "${MODEL}", version: "v1", mode: STOPPED) { __typename ... on Error { message } } }`,
      )
    ).data.serveMirrorVersion,
  ).toEqual({ __typename: 'ServePlaced' });

  agent = await startAgent({
    baseURL: baseURL as string,
    nodeToken,
    env: {
      HANGAR_TRAINER: `${process.execPath} ${path.resolve('../server/test/fixtures/stand-in-trainer.mjs')}`,
      HANGAR_STAND_IN_STEP_MS: '100',
    },
  });
  // Pairs a person can read, so the side-by-side table reads as it would for a team.
  const data = Array.from({ length: 40 }, (_, i) =>
    JSON.stringify({ q: `Which floor is meeting room ${i + 1} on?`, a: `Floor ${(i % 6) + 1}.` }),
  ).join('\n');
  let id = '';
  await expect(async () => {
    const created = await gql(
      `mutation($i: CreateTrainJobInput!) { createTrainJob(input: $i) { __typename ... on TrainJob { id } ... on Error { message } } }`,
      {
        i: {
          name: JOB,
          model: MODEL,
          baseRepo: trainBaseRepo,
          node: NODE,
          gpuMiB: 2048,
          public: true,
          data,
          params: { batch: 1, epochs: 1, rank: 4 },
        },
      },
    );
    expect(created.data.createTrainJob.__typename, JSON.stringify(created)).toBe('TrainJob');
    id = created.data.createTrainJob.id;
  }).toPass({ timeout: 30_000, intervals: [1000] });

  await signIn(page);
  // Signed in once the console's navigation is there; then straight to the job's page, as a link would.
  await expect(page.getByRole('navigation').getByRole('link', { name: 'Training' })).toBeVisible();
  await page.goto(`/training/${id}`);
  await expect(page.getByRole('heading', { name: JOB })).toBeVisible();
  await expect(page.locator('.job-head').getByText('done', { exact: true })).toBeVisible({ timeout: 180_000 });
  const evaluation = page.getByRole('region', { name: 'Evaluation' });
  await expect(evaluation.getByText('Its own held-out pairs (5)')).toBeVisible();
  await expect(evaluation.getByRole('table', { name: 'The questions, side by side' }).getByRole('row')).toHaveCount(
    1 + 5 + 16,
  );
  await expect(page.getByRole('figure', { name: /^Loss/ })).toContainText('held-out loss');
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    expect(await overflows(page)).toEqual([]);
    await page.getByRole('figure', { name: /^Loss/ }).scrollIntoViewIfNeeded();
    await page.screenshot({ path: `artifacts/screens/training-eval-curves-${width}.png` });
    await evaluation.scrollIntoViewIfNeeded();
    await page.screenshot({ path: `artifacts/screens/training-eval-${width}.png` });
    await snap(page, `training-eval-page-${width}`);
  }

  // Leave the catalog and the mirror as the other tests expect them.
  expect((await gql(`mutation { deleteTrainJob(id: "${id}") { __typename } }`)).data.deleteTrainJob.__typename).toBe(
    'DeletedTrainJob',
  );
  expect((await gql(`mutation { removeModel(name: "${MODEL}") { __typename } }`)).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  expect(
    (await gql(`mutation { removeMirrorVersion(model: "${MODEL}", version: "v1", force: true) { __typename } }`)).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
});
