import path from 'node:path';
import { expect, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

// A model's autoscaling on its page: an operator sets its bounds and target in the form (a refusal names the
// field), concurrent streams through the gateway make the autoscaler add a replica, and their end makes it drain
// one away; the page lists both decisions with their reasons. The node is a real agent whose llama.cpp replicas run
// through the stand-in llama-server (packages/agent/test/fixtures/stand-in-engine.mjs), which streams slowly enough
// for the load to be seen. The e2e server's window is 2 s (HANGAR_SCALE_WINDOW_SECONDS in playwright.config.ts).

const MODEL = 'e2e-scaled';
const NODE = 'e2e-scaling-node';
const STAND_IN = path.resolve('../packages/agent/test/fixtures/stand-in-engine.mjs');

let agent: RunningAgent | undefined;
test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

test('an operator autoscales a model and reads why each replica came and went', async ({ page, request, baseURL }) => {
  test.setTimeout(180_000);
  const { gql } = await adminApi(request);
  const nodeToken = (await gql(`mutation { createNode(name: "${NODE}") { ... on CreatedNode { token } } }`)).data
    .createNode.token as string;
  const secret = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-scaling", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put(`/mirror/${MODEL}/v1/tiny-llama.gguf`, {
    headers: { authorization: `Bearer ${secret}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    `mutation { serveMirrorVersion(model: "${MODEL}", version: "v1", mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }`,
  );
  expect(served.data.serveMirrorVersion).toMatchObject({ __typename: 'ServePlaced' });
  await gql(`mutation { setModelRouting(name: "${MODEL}", policy: LEAST_LOADED) { __typename } }`);
  agent = await startAgent({
    baseURL: baseURL as string,
    nodeToken,
    env: {
      HANGAR_AGENT_GPUS: JSON.stringify(
        [0, 1].map((index) => ({ index, name: 'Declared GPU', totalMiB: 24564, freeMiB: 20000 })),
      ),
      HANGAR_AGENT_LLAMA_SERVER: `${process.execPath} ${STAND_IN} --stand-in-stream-ms 200`,
    },
  });
  const ready = async () =>
    (await gql(`{ model(name: "${MODEL}") { replicas { state drainingSince } } }`)).data.model.replicas.filter(
      (r: { state: string; drainingSince: string | null }) => r.state === 'READY' && !r.drainingSince,
    ).length;
  await expect.poll(ready, { timeout: 60_000 }).toBe(1);

  await signIn(page);
  await expect(page.getByRole('navigation').getByRole('link', { name: 'Models' })).toBeVisible();
  await page.goto(`/models/${MODEL}`);
  const section = page.getByRole('region', { name: `Autoscaling of ${MODEL}` });
  await expect(section.getByText('Not autoscaled: it runs the fixed count its mode sets.')).toBeVisible();
  const form = section.getByRole('form', { name: `Autoscaling of ${MODEL}` });
  // A most under the fewest is refused, naming the field and what is accepted.
  await form.getByLabel('Fewest').fill('3');
  await form.getByLabel('Most').fill('2');
  await form.getByRole('button', { name: 'Autoscale' }).click();
  await expect(section.getByText(/maxReplicas.*at least minReplicas \(3\)/)).toBeVisible();
  await form.getByLabel('Fewest').fill('1');
  await form.getByLabel('Most').fill('2');
  await form.getByLabel('In flight per replica').fill('1');
  await form.getByRole('button', { name: 'Autoscale' }).click();
  await expect(
    section.getByText('Autoscaled between 1 and 2 replicas, keeping about 1 request in flight per replica.'),
  ).toBeVisible();
  await expect(section.getByText('No scaling decision yet.')).toBeVisible();

  // Four streams at once on one replica, one after another, until a second replica serves.
  let stop = false;
  const stream = async () => {
    while (!stop) {
      const res = await request.post('/v1/chat/completions', {
        headers: { authorization: `Bearer ${secret}` },
        data: { model: MODEL, messages: [{ role: 'user', content: 'hello' }], stream: true },
        timeout: 30_000,
      });
      expect(res.status()).toBe(200);
      expect(await res.text()).toContain('[DONE]');
    }
  };
  const callers = Array.from({ length: 4 }, stream);
  await expect.poll(ready, { timeout: 60_000 }).toBe(2);
  stop = true;
  await Promise.all(callers);
  // Idle now: one replica drains away.
  await expect
    .poll(async () => (await gql(`{ model(name: "${MODEL}") { replicas { state } } }`)).data.model.replicas.length, {
      timeout: 60_000,
    })
    .toBe(1);
  await page.reload();
  const decisions = section.getByRole('listitem');
  await expect(decisions).toHaveCount(2);
  await expect(decisions.nth(0)).toContainText(/in flight per replica for [\d.]+ s, target 1: 2 → 1$/);
  await expect(decisions.nth(1)).toContainText(/in flight per replica for [\d.]+ s, target 1: 1 → 2$/);
  await snap(page, '40-model-autoscaling');
  await page.setViewportSize({ width: 800, height: 800 });
  await expectNothingClipped(section);
  await snap(page, '40-model-autoscaling-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  // Put back as found: the registry and models specs expect no served model of theirs to be in the way.
  await gql(`mutation { setModelMode(name: "${MODEL}", mode: STOPPED) { __typename } }`);
  await expect
    .poll(async () => (await gql(`{ model(name: "${MODEL}") { replicas { state } } }`)).data.model.replicas.length, {
      timeout: 60_000,
    })
    .toBe(0);
  expect((await gql(`mutation { removeModel(name: "${MODEL}") { __typename } }`)).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  // The mirror too: the mirror spec removes its own version and then expects an empty mirror.
  expect(
    (await gql(`mutation { removeMirrorVersion(model: "${MODEL}", version: "v1") { __typename } }`)).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
});
