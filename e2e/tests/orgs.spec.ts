import path from 'node:path';
import { expect, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';
import { trainBaseRepo } from '../fixtures/stand-in-hub.js';

// The Organisations page from an empty site to a team-owned adapter called by a member's token: the org, its team
// and project and their members made on the page; a LoRA job owned by the team, trained by a real node agent (the
// stand-in trainer: this machine has no GPU and no PyTorch), published, and served by that agent's llama.cpp on
// the CPU; the member's token calls the adapter through /v1, a token outside the team is told it does not exist;
// the owner shown by name on the Models page; and the team's removal refused on the page, saying what it owns.

const NODE = 'e2e-orgs-node';
const MODEL = 'e2e-orgs-base';
const ADAPTER = 'e2e-support-lora';

let agent: RunningAgent | undefined;

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

function pairs(): string {
  return `${Array.from({ length: 8 }, (_, i) =>
    JSON.stringify({ q: `Where is ticket ${i + 1}?`, a: `Ticket ${i + 1} is with the support team.` }),
  ).join('\n')}\n`;
}

test('an admin builds an org on the Organisations page, and a member token calls the team-owned adapter', async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const { gql } = await adminApi(request);
  const nodeToken = (await gql(`mutation { createNode(name: "${NODE}") { ... on CreatedNode { token } } }`)).data
    .createNode.token as string;
  const token = async (name: string) => {
    const made = await gql(
      `mutation { createApiToken(input: { name: "${name}", role: OPERATOR }) { ... on CreatedApiToken { secret token { id } } } }`,
    );
    return made.data.createApiToken as { secret: string; token: { id: string } };
  };
  const uploader = await token('e2e-orgs-upload');
  const member = await token('e2e-support-app');
  const outsider = await token('e2e-outsider-app');
  const put = await request.put(`/mirror/${MODEL}/v1/tiny-llama.gguf`, {
    headers: { authorization: `Bearer ${uploader.secret}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    `mutation { serveMirrorVersion(model: "${MODEL}", version: "v1", mode: STOPPED) { __typename ... on Error { message } } }`,
  );
  expect(served.data.serveMirrorVersion).toEqual({ __typename: 'ServePlaced' });
  await gql(
    'mutation { createUser(input: { email: "ana@e2e-acme.test", name: "Ana", role: VIEWER, password: "a-long-enough-password" }) { __typename } }',
  );

  // From an empty site: no organisation yet.
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Organisations' }).click();
  await expect(page.getByRole('heading', { name: 'Organisations', level: 1 })).toBeVisible();
  await expect(page.getByText('No organisations yet. Create one below.')).toBeVisible();
  await snap(page, 'orgs-empty');

  await page.getByLabel('Organisation name').fill('e2e-acme');
  await page.getByRole('button', { name: 'Create organisation' }).click();
  const org = page.getByRole('region', { name: 'Organisation e2e-acme' });
  await expect(org).toBeVisible();
  await org.getByLabel('New team in e2e-acme').fill('support');
  await org.getByRole('button', { name: 'Add team' }).click();
  const team = org.getByRole('listitem', { name: 'Team e2e-acme/support' });
  await team.getByLabel('New project in e2e-acme/support').fill('tickets');
  await team.getByRole('button', { name: 'Add project' }).click();
  await expect(team.getByRole('listitem', { name: 'Project e2e-acme/support/tickets' })).toBeVisible();

  // A refusal in the server's words, next to the form that was refused.
  const addMember = org.getByRole('form', { name: 'Add a member to e2e-acme' });
  await addMember.getByLabel('Place').selectOption('e2e-acme/support');
  await addMember.getByLabel('User email or API token id').fill('nobody@e2e-acme.test');
  await addMember.getByRole('button', { name: 'Add member' }).click();
  await expect(addMember.locator('..').getByRole('alert')).toContainText('no user nobody@e2e-acme.test');
  await addMember.getByLabel('User email or API token id').fill('ana@e2e-acme.test');
  await addMember.getByRole('button', { name: 'Add member' }).click();
  await expect(team.getByRole('list', { name: 'Members of e2e-acme/support' })).toContainText('user:ana@e2e-acme.test');
  await addMember.getByLabel('Place').selectOption('e2e-acme/support');
  await addMember.getByLabel('User email or API token id').fill(member.token.id);
  await addMember.getByRole('button', { name: 'Add member' }).click();
  // A token is shown by its name and its user, as owners are everywhere.
  await expect(team.getByRole('list', { name: 'Members of e2e-acme/support' })).toContainText(
    'key:e2e-support-app (admin@example.com)',
  );
  // A rename: owners are kept by id, so nothing changes hands.
  await team.getByRole('button', { name: 'Rename e2e-acme/support/tickets' }).click();
  await team.getByRole('form', { name: 'Rename e2e-acme/support/tickets' }).getByLabel('New name').fill('helpdesk');
  await team.getByRole('button', { name: 'Save' }).click();
  await expect(team.getByRole('listitem', { name: 'Project e2e-acme/support/helpdesk' })).toBeVisible();
  // The team's budget is read where the team is: what is left of each of its limits.
  const limit = await gql(
    'mutation { setLimit(scope: "team:e2e-acme/support", limit: { tokensPerDay: 500000, spendPerMonth: 40 }) { __typename ... on Error { message } } }',
  );
  expect(limit.data.setLimit.__typename).toBe('Limit');
  await page.reload();
  await expect(page.getByTestId('limits-e2e-acme/support')).toHaveText(
    'Limits: 500,000 of 500,000 tokens today left · 40.00 of 40.00 to spend this month left',
  );
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    await expectNothingClipped(page.locator('main'));
    await snap(page, `orgs-tree-${width}`);
  }
  await page.setViewportSize({ width: 1280, height: 800 });

  // The team's adapter: a LoRA job owned by team:e2e-acme/support, trained on the node, published.
  agent = await startAgent({
    baseURL: baseURL as string,
    nodeToken,
    env: {
      HANGAR_TRAINER: `${process.execPath} ${path.resolve('../server/test/fixtures/stand-in-trainer.mjs')}`,
      HANGAR_STAND_IN_STEP_MS: '50',
    },
  });
  await expect
    .poll(
      async () =>
        (await gql('{ nodes { name online } }')).data.nodes.some(
          (n: { name: string; online: boolean }) => n.name === NODE && n.online,
        ),
      {
        timeout: 60_000,
      },
    )
    .toBe(true);
  const created = await gql(
    `mutation($data: String!) { createTrainJob(input: { name: "${ADAPTER}", model: "${MODEL}", baseRepo: "${trainBaseRepo}", node: "${NODE}", gpuMiB: 2048, owner: "team:e2e-acme/support", data: $data, params: { epochs: 1, batch: 1 } }) { __typename ... on TrainJob { id } ... on Error { message } } }`,
    { data: pairs() },
  );
  expect(created.data.createTrainJob.__typename, JSON.stringify(created)).toBe('TrainJob');
  const jobId = created.data.createTrainJob.id as string;
  await expect
    .poll(async () => (await gql(`{ trainJob(id: "${jobId}") { state message } }`)).data.trainJob.state, {
      timeout: 120_000,
      intervals: [1000],
    })
    .toBe('DONE');
  const published = await gql(
    `mutation { publishTrainJob(id: "${jobId}", force: true, reason: "e2e: the stand-in's adapter is noise") { __typename ... on Error { message } } }`,
  );
  expect(published.data.publishTrainJob.__typename, JSON.stringify(published)).toBe('TrainJobPublished');

  // Served: one replica on the agent's llama.cpp, answering for the adapter.
  const mode = await gql(
    `mutation { setModelMode(name: "${MODEL}", mode: ALWAYS, replicas: 1) { __typename ... on Error { message } } }`,
  );
  expect(mode.data.setModelMode.__typename, JSON.stringify(mode)).not.toMatch(/Error$/);
  await expect
    .poll(
      async () =>
        (await gql(`{ model(name: "${MODEL}") { replicas { state adapters } } }`)).data.model.replicas.some(
          (r: { state: string; adapters: string[] }) => r.state === 'READY' && r.adapters.includes(ADAPTER),
        ),
      { timeout: 120_000, intervals: [1000] },
    )
    .toBe(true);

  const call = (secret: string) =>
    request.post('/v1/chat/completions', {
      headers: { authorization: `Bearer ${secret}` },
      data: { model: ADAPTER, messages: [{ role: 'user', content: 'Where is ticket 3?' }], max_tokens: 4 },
    });
  const asMember = await call(member.secret);
  expect(asMember.status(), await asMember.text()).toBe(200);
  expect((await asMember.json()).choices[0].message).toBeTruthy();
  const asOutsider = await call(outsider.secret);
  expect(asOutsider.status()).toBe(404);
  expect((await asOutsider.json()).error.code).toBe('model_not_found');

  // The owner by name on the Models page, not team:<uuid>.
  await page.getByRole('navigation').getByRole('link', { name: 'Models' }).click();
  await expect(page.getByRole('list', { name: `Adapters of ${MODEL}` })).toContainText(
    `${ADAPTER} · team:e2e-acme/support`,
  );
  await snap(page, 'orgs-models-owner');
  // And on the Audit page, beside what the row is about.
  await page.getByRole('navigation').getByRole('link', { name: 'Audit' }).click();
  await expect(page.getByRole('row', { name: /createTrainJob/ }).first()).toContainText(
    `${ADAPTER} · team:e2e-acme/support`,
  );
  await snap(page, 'orgs-audit-owner');

  // Removing the team: what it would do, before anything is removed, and refused while it owns the adapter.
  await page.getByRole('navigation').getByRole('link', { name: 'Organisations' }).click();
  await team.getByRole('button', { name: 'Remove e2e-acme/support', exact: true }).click();
  const ask = team.getByRole('group', { name: 'Remove e2e-acme/support?' });
  const preview = ask.getByTestId('removal-preview');
  await expect(preview).toContainText('Refused while team e2e-acme/support owns these');
  await expect(preview).toContainText(`Adapters: ${ADAPTER}`);
  await expect(preview).toContainText(`Training jobs: ${ADAPTER}`);
  await expect(preview).toContainText('Projects: e2e-acme/support/helpdesk');
  await expect(preview).toContainText('user:ana@e2e-acme.test at e2e-acme/support');
  await expect(preview).toContainText('API tokens that lose this access: e2e-support-app (admin@example.com)');
  await expect(ask.getByRole('button', { name: 'Remove e2e-acme/support' })).toBeDisabled();
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    await expectNothingClipped(page.locator('main'));
    await snap(page, `orgs-removal-${width}`);
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  await ask.getByRole('button', { name: 'Keep it' }).click();

  // Clean up for the specs after this one: the job, the model (its adapter with it), the mirror versions, the
  // agent (offline at once: it says it is leaving), then the org.
  expect((await gql(`mutation { deleteTrainJob(id: "${jobId}") { __typename } }`)).data.deleteTrainJob.__typename).toBe(
    'DeletedTrainJob',
  );
  expect((await gql(`mutation { removeModel(name: "${MODEL}") { __typename } }`)).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  const mirror = await gql('{ mirror { families { versions { model version } } } }');
  for (const v of (mirror.data.mirror.families as { versions: { model: string; version: string }[] }[])
    .flatMap((f) => f.versions)
    .filter((x) => x.model === MODEL || x.model === ADAPTER)) {
    await gql(
      `mutation { removeMirrorVersion(model: "${v.model}", version: "${v.version}", force: true) { __typename } }`,
    );
  }
  await agent?.stop();
  agent = undefined;
  // Now it owns nothing: the page removes the org, with its team, project and memberships.
  await page.reload();
  await org.getByRole('button', { name: 'Remove e2e-acme', exact: true }).click();
  const askOrg = org.getByRole('group', { name: 'Remove e2e-acme?' });
  await expect(askOrg.getByTestId('removal-preview')).toContainText(
    'owns no collection, model, adapter or training job',
  );
  await askOrg.getByRole('button', { name: 'Remove e2e-acme' }).click();
  await expect(page.getByText('No organisations yet. Create one below.')).toBeVisible();
  for (const name of ['e2e-orgs-upload', 'e2e-support-app', 'e2e-outsider-app']) {
    const list = await gql('{ apiTokens { id name } }');
    const id = list.data.apiTokens.find((t: { name: string }) => t.name === name)?.id;
    if (id) await gql('mutation($id: ID!) { revokeApiToken(id: $id) { __typename } }', { id });
  }
});
