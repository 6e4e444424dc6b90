import path from 'node:path';
import { expect, type Page, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, overflows, signIn, snap } from '../fixtures/hangar.js';
import { trainBaseRepo } from '../fixtures/stand-in-hub.js';

// A LoRA training job from the console to the catalog, with a real node agent: the tiny llama GGUF in the mirror
// and in the catalog (llama.cpp), a job submitted from the New job page with a pairs file, followed live on its
// page and in the list, its adapter made into a GGUF by Hangar and published, and seen under its model. The GPU is
// declared (HANGAR_AGENT_GPUS) and the trainer is the stand-in (server/test/fixtures/stand-in-trainer.mjs): this
// machine has no GPU and no PyTorch. The base weights come from the stand-in Hub (hangar-test/tiny-llama).

const NODE = 'e2e-trainer';
const MODEL = 'e2e-lora-base';
const JOB = 'e2e-support-tone';

let agent: RunningAgent | undefined;

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

/**
 * 25 pairs, one of them repeated (the report names it). 5 distinct questions are held out to evaluate the adapter
 * (10 %, at least 5, picked by seed 42: lines 2, 9, 14, 18, 25), so 21 are trained on: with batch 1 and 4 epochs,
 * 84 steps of 150 ms.
 */
function pairsFile(): Buffer {
  const lines = Array.from({ length: 25 }, (_, i) =>
    JSON.stringify({
      q: `How do I reset the router in room ${i + 1}?`,
      a: `Hold the reset button for ten seconds, room ${i + 1}.`,
    }),
  );
  lines.push(lines[2] as string);
  return Buffer.from(`${lines.join('\n')}\n`);
}

/** The step the page shows now ("step 12 of 84"), or 0 before the first. */
async function shownStep(page: Page, where = page.getByTestId('train-steps').first()): Promise<number> {
  const text = (await where.textContent({ timeout: 1000 }).catch(() => null)) ?? '';
  return Number(/step ([\d,]+) of/.exec(text)?.[1]?.replace(/,/g, '') ?? 0);
}

test('a LoRA job submitted from the console trains on a node agent, live, and its adapter is published', async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(180_000);
  const { gql } = await adminApi(request);

  // The model the adapter is for: the tiny llama in the mirror, in the catalog as a llama.cpp model. Stopped, so
  // the agent spends this machine's two cores on training rather than on a replica nobody asks.
  const nodeToken = (await gql(`mutation { createNode(name: "${NODE}") { ... on CreatedNode { token } } }`)).data
    .createNode.token as string;
  const secret = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-training", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put(`/mirror/${MODEL}/v1/tiny-llama.gguf`, {
    headers: { authorization: `Bearer ${secret}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    `mutation { serveMirrorVersion(model: "${MODEL}", version: "v1", mode: STOPPED) { __typename ... on Error { message } } }`,
  );
  expect(served.data.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });

  agent = await startAgent({
    baseURL: baseURL as string,
    nodeToken,
    env: {
      HANGAR_TRAINER: `${process.execPath} ${path.resolve('../server/test/fixtures/stand-in-trainer.mjs')}`,
      HANGAR_STAND_IN_STEP_MS: '150',
    },
  });

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Training' }).click();
  await expect(page.getByText('No training jobs yet.')).toBeVisible();
  await snap(page, 'training-empty');
  await page.getByRole('link', { name: 'New job' }).first().click();
  await expect(page.getByRole('heading', { name: 'New training job' })).toBeVisible();

  await page.getByLabel('Name', { exact: true }).fill(JOB);
  await page.getByLabel('Model', { exact: true }).selectOption(MODEL);
  // llama.cpp serves the model: the GGUF adapter is made unless the operator says otherwise.
  await expect(page.getByLabel('Make the llama.cpp GGUF adapter')).toBeChecked();
  await page.getByLabel('Base weights', { exact: true }).fill(trainBaseRepo);
  // The node's GPUs are listed once its agent has reported them.
  await expect(async () => {
    await page.reload();
    await page.getByLabel('Name', { exact: true }).fill(JOB);
    await page.getByLabel('Model', { exact: true }).selectOption(MODEL);
    await page.getByLabel('Base weights', { exact: true }).fill(trainBaseRepo);
    await page.getByLabel('Node', { exact: true }).selectOption(NODE);
    await expect(page.getByText('GPU 0: 20,000 MiB free of 24,564', { exact: true })).toBeVisible({ timeout: 1000 });
  }).toPass({ timeout: 30_000, intervals: [1000] });
  await page.getByLabel('GPU memory (MiB)', { exact: true }).fill('2048');
  await page.getByLabel(/^Public/).check();
  await page.getByLabel('batch', { exact: true }).fill('1');
  await page.getByLabel('epochs', { exact: true }).fill('4');
  await page.getByLabel('Pairs file', { exact: true }).setInputFiles({
    name: 'support-pairs.jsonl',
    mimeType: 'application/x-ndjson',
    buffer: pairsFile(),
  });
  const report = page.getByRole('region', { name: 'Report on support-pairs.jsonl' });
  await expect(report).toContainText('26 pairs');
  await expect(report).toContainText('line 26 repeats line 3');
  await expect(report).toContainText('Ready to train on. 1 pair repeats an earlier one');
  // Counted with the model's own tokenizer (its GGUF's vocabulary, read by llama.cpp on the server).
  await expect(report).toContainText("e2e-lora-base's tokenizer");
  await expect(report).toContainText('none: the longest pair is');
  await snap(page, 'training-new');

  await page.getByRole('button', { name: 'Queue the job' }).click();
  await expect(page).toHaveURL(/\/training\/[0-9a-f-]{36}$/);
  const jobUrl = page.url();
  await expect(page.getByRole('heading', { name: JOB })).toBeVisible();
  // Nothing below reloads the page: the marker would be gone if anything did.
  await page.evaluate(() => {
    (window as unknown as { notReloaded: boolean }).notReloaded = true;
  });

  // Live: the step count climbs while the page just sits there.
  await expect(page.getByText(/step \d+ of 84/)).toBeVisible({ timeout: 60_000 });
  const first = await shownStep(page);
  await expect.poll(() => shownStep(page), { timeout: 15_000 }).toBeGreaterThan(first);
  await expect(page.getByRole('figure', { name: /^Loss/ }).getByRole('img')).toBeVisible();
  await snap(page, 'training-job-running');

  // The list follows the job too, from its subscription.
  await page.getByRole('link', { name: 'Training', exact: true }).first().click();
  const row = page.getByTestId(`train-job-${JOB}`);
  await expect(row).toBeVisible();
  const inList = row.getByTestId('train-steps');
  const listed = await shownStep(page, inList);
  await expect.poll(() => shownStep(page, inList), { timeout: 15_000 }).toBeGreaterThan(listed);
  await snap(page, 'training-list');

  await row.getByRole('link', { name: JOB }).click();
  await expect(page).toHaveURL(jobUrl);
  await expect(page.locator('.job-head').getByText('done', { exact: true })).toBeVisible({ timeout: 90_000 });
  expect(await page.evaluate(() => (window as unknown as { notReloaded?: boolean }).notReloaded)).toBe(true);
  const artifacts = page.getByRole('region', { name: 'Artifacts' });
  await expect(artifacts.getByRole('row', { name: /peft/ })).toBeVisible();
  await expect(artifacts.getByRole('row', { name: /gguf/ })).toBeVisible();
  // The node had the base and the adapter answer the held-out questions (real llama.cpp on the tiny llama): the
  // evaluation is on the page, the questions side by side.
  const evaluation = page.getByRole('region', { name: 'Evaluation' });
  await expect(evaluation.getByText('Its own held-out pairs (5)')).toBeVisible();
  await expect(evaluation.getByRole('table', { name: 'The questions, side by side' }).getByRole('row')).toHaveCount(
    1 + 5 + 16,
  );
  await expect(page.getByRole('figure', { name: /^Loss/ })).toContainText('held-out loss');

  // The loss chart reads out the step and the loss under the pointer.
  const loss = page.getByRole('figure', { name: /^Loss/ });
  await loss.getByRole('img').hover({ position: { x: 30, y: 40 } });
  await expect(loss.getByRole('status')).toHaveText(/^step \d+ loss \d/);
  await snap(page, 'training-job-loss-hover');
  // The page fits at both widths: no table scrolls its Download buttons out of sight.
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    expect(await overflows(page)).toEqual([]);
    await snap(page, `training-job-${width}`);
    await evaluation.scrollIntoViewIfNeeded();
    await page.screenshot({ path: `artifacts/screens/training-evaluation-${width}.png`, fullPage: false });
  }
  await page.setViewportSize({ width: 1280, height: 800 });

  await page.getByRole('button', { name: 'Publish' }).click();
  // The answer says where it went and that running replicas load it without a restart.
  const answer = page.getByRole('status').filter({ hasText: `Published as ${MODEL}'s adapter ${JOB}:` });
  await expect(answer).toContainText(`load ${JOB} within seconds, without a restart`);
  await expect(answer).toContainText(`/mirror/${JOB}/`);
  await expect(answer.getByRole('link', { name: `see it under ${MODEL} on the Models page` })).toBeVisible();
  await snap(page, 'training-job');

  await page.getByRole('link', { name: `see it under ${MODEL} on the Models page` }).click();
  await expect(page.getByRole('list', { name: `Adapters of ${MODEL}` })).toContainText(`${JOB} · everyone`);
  await snap(page, 'training-models-adapter');

  // Leave the mirror and the catalog as the other tests expect them: the job, the model (its adapter with it),
  // the base's and the adapter's mirror versions.
  const jobId = jobUrl.split('/').pop();
  expect((await gql(`mutation { deleteTrainJob(id: "${jobId}") { __typename } }`)).data.deleteTrainJob.__typename).toBe(
    'DeletedTrainJob',
  );
  expect((await gql(`mutation { removeModel(name: "${MODEL}") { __typename } }`)).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  const mirror = await gql('{ mirror { families { versions { model version } } } }');
  const versions = (mirror.data.mirror.families as { versions: { model: string; version: string }[] }[]).flatMap(
    (f) => f.versions,
  );
  for (const v of versions.filter((v) => v.model === MODEL || v.model === JOB)) {
    const removed = await gql(
      `mutation { removeMirrorVersion(model: "${v.model}", version: "${v.version}", force: true) { __typename } }`,
    );
    expect(removed.data.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
  }
});
