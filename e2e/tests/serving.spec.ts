import { expect, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { admin, signIn, snap } from '../fixtures/hangar.js';

// The whole serving path with a real node agent: a tiny random-weight llama (the real 32000-token vocabulary)
// in the mirror, served from the console, loaded by the agent with llama.cpp on CPU, and seen ready on the Nodes
// and Models pages with its smoke test. The agent's GPU is declared (HANGAR_AGENT_GPUS): this machine has none.

let agent: RunningAgent | undefined;

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

test('a model served from the console becomes ready on a node agent, with its smoke test', async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(120_000);
  const login = await request.post('/graphql', {
    data: {
      query: `mutation { login(email: "${admin.email}", password: "${admin.password}") { ... on LoginPayload { csrfToken } } }`,
    },
  });
  const csrf = (await login.json()).data.login.csrfToken as string;
  const gql = async (query: string) =>
    (await request.post('/graphql', { headers: { 'x-hangar-csrf': csrf }, data: { query } })).json();
  const nodeToken = (await gql('mutation { createNode(name: "e2e-cpu") { ... on CreatedNode { token } } }')).data
    .createNode.token as string;
  const token = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-serving", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put('/mirror/e2e-tiny/v1/tiny-llama.gguf', {
    headers: { authorization: `Bearer ${token}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);

  agent = await startAgent({ baseURL: baseURL as string, nodeToken });

  await signIn(page);
  const row = page.getByRole('row', { name: /e2e-tiny/ });
  await row.getByRole('button', { name: 'Serve' }).click();
  await expect(page.getByText('fits', { exact: false }).first()).toBeVisible();
  await page.getByRole('button', { name: 'Put into service' }).click();
  await expect(page.getByText('e2e-tiny is in the catalog: replicas are placed on the next pass')).toBeVisible();

  await page.getByRole('navigation').getByRole('link', { name: 'Nodes' }).click();
  const chips = page.getByRole('list', { name: 'Replicas on e2e-cpu' });
  await expect(async () => {
    await page.reload();
    await expect(chips).toContainText('e2e-tiny READY', { timeout: 2000 });
  }).toPass({ timeout: 90_000, intervals: [1000] });
  await snap(page, '20-nodes-replica-ready');

  await page.getByRole('navigation').getByRole('link', { name: 'Models' }).click();
  // What it holds on which card: the plan's figure until the agent measures it on a GPU (this one runs on the CPU).
  await expect(
    page.getByText(/READY on e2e-cpu GPU 0: [\d.]+ [KMG]iB of 24 GiB \(planned\) · [\d.]+ tok\/s/),
  ).toBeVisible();
  await snap(page, '21-models-replica-ready');
  await page.setViewportSize({ width: 800, height: 800 });
  await snap(page, '21-models-replica-ready-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  // Stopped from the console's API: the agent stops the replica and says so. The card shows current replicas
  // only, so the stopped one leaves it, and the mode's words say none runs once the agent has reported it.
  await gql('mutation { setModelMode(name: "e2e-tiny", mode: STOPPED) { __typename } }');
  await expect(page.getByText('stopped: no replica runs', { exact: false })).toBeVisible({ timeout: 30_000 });
  await expect(page.getByText(/READY on e2e-cpu/)).toHaveCount(0);

  expect((await gql('mutation { removeModel(name: "e2e-tiny") { __typename } }')).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  expect(
    (await gql('mutation { removeMirrorVersion(model: "e2e-tiny", version: "v1") { __typename } }')).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
});
