import { readFile } from 'node:fs/promises';
import { expect, test } from '@playwright/test';
import { gguf as ggufHeader } from '../../packages/common/test/fixtures/gguf-writer.js';
import { admin, signIn, snap } from '../fixtures/hangar.js';

// Serving a mirrored model from the console. The e2e server has no node agent, so the replica waits and says
// why; the test cleans up after itself (the registry test expects a mirror without this version).

test('an operator serves a mirrored version after seeing its plan, then changes how it runs', async ({
  page,
  request,
}) => {
  // A file in the mirror, put there the way a script would: sign in, make a token, PUT it.
  const login = await request.post('/graphql', {
    data: {
      query: `mutation { login(email: "${admin.email}", password: "${admin.password}") { ... on LoginPayload { csrfToken } } }`,
    },
  });
  const csrf = (await login.json()).data.login.csrfToken as string;
  const made = await request.post('/graphql', {
    headers: { 'x-hangar-csrf': csrf },
    data: {
      query:
        'mutation { createApiToken(input: { name: "e2e-models", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    },
  });
  const token = (await made.json()).data.createApiToken.secret as string;
  const gguf = await readFile(
    new URL('../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
  );
  const put = await request.put('/mirror/e2e-served/v1/model.gguf', {
    headers: { authorization: `Bearer ${token}` },
    data: gguf,
  });
  expect(put.status()).toBe(201);
  // A LoRA adapter's file, which the header says is one: its row offers no Serve.
  const adapter = ggufHeader([
    ['general.architecture', 'str', 'llama'],
    ['general.type', 'str', 'adapter'],
    ['adapter.type', 'str', 'lora'],
  ]).header;
  const putAdapter = await request.put('/mirror/e2e-lora/job-1/e2e-lora.gguf', {
    headers: { authorization: `Bearer ${token}` },
    data: adapter,
  });
  expect(putAdapter.status()).toBe(201);

  await signIn(page);
  const adapterRow = page.getByRole('row', { name: /e2e-lora/ });
  await expect(adapterRow.getByText('a LoRA adapter for llama: publish it to a model')).toBeVisible();
  await expect(adapterRow.getByRole('button', { name: 'Serve' })).toHaveCount(0);
  const row = page.getByRole('row', { name: /e2e-served/ });
  await row.getByRole('button', { name: 'Serve' }).click();
  // The plan comes before anything is created.
  await expect(page.getByText(/llama/).first()).toBeVisible();
  await expect(page.getByText(/no node|fits/i).first()).toBeVisible();
  await snap(page, '17-serve-plan');
  // In the serve form: the mirror's filter has a Name field too.
  await page.getByRole('form', { name: 'Serve e2e-served/v1' }).getByLabel('Name').fill('e2e-llama');
  await page.getByRole('button', { name: 'Put into service' }).click();
  await expect(page.getByText('e2e-llama is in the catalog: replicas are placed on the next pass')).toBeVisible();

  await page.getByRole('navigation').getByRole('link', { name: 'Models' }).click();
  await expect(page.getByText('PENDING: no node is online')).toBeVisible();
  // The card's live usage, read from the server's usage query: nothing has called it yet.
  await expect(page.getByTestId('model-e2e-llama').getByText('No requests in the last hour.')).toBeVisible();
  // What the mode means now, on the card; and the page follows the catalog live.
  await expect(page.getByTestId('model-e2e-llama').getByTestId('mode-message')).toHaveText(
    'always: 1 replica is being placed',
  );
  await expect(page.getByText('Live: cards follow their replicas')).toBeVisible();
  // How the gateway routes it: by prefix, the default for a chat model (#29).
  await expect(page.getByTestId('model-e2e-llama').getByTestId('model-routing')).toHaveText('by prefix');
  await snap(page, '18-models-pending');
  await page.setViewportSize({ width: 800, height: 800 });
  await snap(page, '18-models-pending-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  await page.getByLabel('Mode', { exact: true }).selectOption('STOPPED');
  await page.getByRole('button', { name: 'Apply' }).click();
  // Stopped: the pending replica is stopped with it at the next placement pass, and the page hears of it live.
  await expect(page.getByText('PENDING: no node is online')).toHaveCount(0, { timeout: 15_000 });
  await expect(page.getByText('stopped', { exact: true }).first()).toBeVisible();
  await expect(page.getByTestId('model-e2e-llama').getByTestId('mode-message')).toHaveText(
    'stopped: no replica runs; set it to always or on demand to serve it',
  );
  await snap(page, '19-models-stopped');

  // Leave the mirror as the other tests expect it.
  const cleanup = async (query: string) =>
    (await request.post('/graphql', { headers: { authorization: `Bearer ${token}` }, data: { query } })).json();
  expect(
    (await cleanup('mutation { removeModel(name: "e2e-llama") { __typename } }')).data.removeModel.__typename,
  ).toBe('RemovedModel');
  expect(
    (await cleanup('mutation { removeMirrorVersion(model: "e2e-served", version: "v1") { __typename } }')).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
  expect(
    (await cleanup('mutation { removeMirrorVersion(model: "e2e-lora", version: "job-1") { __typename } }')).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
});
