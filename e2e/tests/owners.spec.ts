import { readFile } from 'node:fs/promises';
import { expect, test } from '@playwright/test';
import { adminApi, signIn, snap } from '../fixtures/hangar.js';

// Who may call what: a caller token made on the Tokens page, refused by the control plane; a model's owner set
// and cleared on the Models page. Cleans up after itself (other specs expect an empty catalog and mirror).

test('an operator makes a caller token, which the control plane refuses, saying what it is for', async ({
  page,
  request,
}) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Tokens' }).click();
  await page.getByLabel('Token name').fill('e2e-chat-app');
  await page.getByRole('checkbox', { name: 'caller only (calls models at /v1, nothing else)' }).check();
  await page.getByRole('button', { name: 'Create token' }).click();
  const secret = ((await page.getByTestId('token-secret').textContent()) ?? '').trim();
  expect(secret).toMatch(/^hgr_/);
  await expect(page.getByTestId('token-curl')).toContainText('/v1/models');
  await expect(page.getByRole('row', { name: /e2e-chat-app/ })).toContainText('caller');
  await snap(page, '40-caller-token');

  const asControl = await request.post('/graphql', {
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    data: { query: '{ nodes { id } }' },
  });
  expect(JSON.stringify(await asControl.json())).toContain('"e2e-chat-app\\" is a caller token');
  const { gql } = await adminApi(request);
  const tokens = await gql('{ apiTokens { id name } }');
  const id = tokens.data.apiTokens.find((t: { name: string }) => t.name === 'e2e-chat-app').id;
  await gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id });
});

test('an operator restricts a model to a team, then makes it public again', async ({ page, request }) => {
  const { gql } = await adminApi(request);
  await gql('mutation { createOrg(name: "e2e-acme") { __typename } }');
  await gql('mutation { createTeam(org: "e2e-acme", name: "research") { __typename } }');
  const made = await gql(
    'mutation { createApiToken(input: { name: "e2e-owners", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
  );
  const token = made.data.createApiToken.secret as string;
  const gguf = await readFile(
    new URL('../../packages/common/test/fixtures/gguf/ggml-vocab-llama-spm.gguf', import.meta.url),
  );
  const put = await request.put('/mirror/e2e-owned/v1/model.gguf', {
    headers: { authorization: `Bearer ${token}` },
    data: gguf,
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    'mutation { serveMirrorVersion(model: "e2e-owned", version: "v1", name: "e2e-owned", mode: STOPPED) { __typename } }',
  );
  expect(served.data.serveMirrorVersion.__typename).toBe('ServePlaced');

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Models' }).click();
  const card = page.getByTestId('model-e2e-owned');
  await expect(card.getByTestId('model-owner')).toHaveText('none: every caller');
  const form = card.getByRole('form', { name: 'Owner of e2e-owned' });
  await form.getByLabel('Owner').fill('team:e2e-acme/nope');
  await form.getByRole('button', { name: 'Set owner' }).click();
  await expect(form.getByRole('alert')).toContainText('owner: org e2e-acme has no team nope');
  await snap(page, '41-model-owner-refused');
  await form.getByLabel('Owner').fill('team:e2e-acme/research');
  await form.getByRole('button', { name: 'Set owner' }).click();
  await expect(card.getByTestId('model-owner')).toHaveText('team:e2e-acme/research');
  await snap(page, '42-model-owned');
  await form.getByRole('button', { name: 'Make public' }).click();
  await expect(card.getByTestId('model-owner')).toHaveText('none: every caller');

  expect((await gql('mutation { removeModel(name: "e2e-owned") { __typename } }')).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  await gql('mutation { removeMirrorVersion(model: "e2e-owned", version: "v1") { __typename } }');
  const org = await gql('{ org(name: "e2e-acme") { id } }');
  await gql('mutation($id: ID!) { deleteOrg(id: $id) { __typename } }', { id: org.data.org.id });
});
