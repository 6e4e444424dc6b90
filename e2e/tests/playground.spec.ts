import { execFile } from 'node:child_process';
import { mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { expect, type Page, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, signIn, snap } from '../fixtures/hangar.js';

// The playground on a model's page, through the gateway to a real replica: the tiny random-weight llama in the
// mirror, served, loaded by a real node agent with llama.cpp on CPU (its GPU is declared: this machine has none),
// and called from the console as the signed-in admin, streaming. What it answers is noise: the test asserts that
// text streams in and the figures appear, not what it says. The calls the page offers to copy are copied with its
// buttons and run as an application would: curl by a shell, the Node snippet by node with the real `openai` client,
// each with a caller-only token.

const NODE = 'e2e-playground-node';
const MODEL = 'e2e-playground';

let agent: RunningAgent | undefined;
const run = promisify(execFile);

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

/** The answer's figures as shown: "first token 12 ms · 350.2 tokens/s · 64 tokens". */
const stats = (page: Page) => page.getByTestId('answer-stats').last();
const answer = (page: Page) => page.getByTestId('answer').last();

test('the playground streams an answer from a real replica, with time to first token and tokens/s, Stop ends one, and its copied calls run as they are', async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(180_000);
  const { gql } = await adminApi(request);
  const nodeToken = (await gql(`mutation { createNode(name: "${NODE}") { ... on CreatedNode { token } } }`)).data
    .createNode.token as string;
  const secret = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-playground", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put(`/mirror/${MODEL}/v1/tiny-llama.gguf`, {
    headers: { authorization: `Bearer ${secret}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    `mutation { serveMirrorVersion(model: "${MODEL}", version: "v1") { __typename ... on Error { message } } }`,
  );
  expect(served.data.serveMirrorVersion).toMatchObject({ __typename: 'ServePlaced' });
  agent = await startAgent({ baseURL: baseURL as string, nodeToken });
  await expect
    .poll(
      async () =>
        (await gql(`{ model(name: "${MODEL}") { replicas { state } } }`)).data.model.replicas.map(
          (r: { state: string }) => r.state,
        ),
      { timeout: 90_000, intervals: [1000] },
    )
    .toContain('READY');

  // From the Models page to the model's own page, where the playground is.
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Models' }).click();
  await expect(page.getByTestId(`model-${MODEL}`)).toBeVisible();
  await snap(page, 'playground-0-models-link');
  await page.getByTestId(`model-${MODEL}`).getByRole('link', { name: 'Playground', exact: true }).click();
  await expect(page).toHaveURL(new RegExp(`/models/${MODEL}$`));
  await expect(page.getByRole('heading', { level: 1, name: MODEL })).toBeVisible();
  await expect(page.getByLabel('Model or adapter')).toHaveValue(MODEL);

  // The exact call names this model and this page's origin.
  await page.getByLabel('Message').fill('Why is the sky blue?');
  await expect(page.getByTestId('call-curl')).toContainText(`curl -N ${baseURL}/v1/chat/completions`);
  await expect(page.getByTestId('call-curl')).toContainText(`"model": "${MODEL}"`);
  await expect(page.getByTestId('call-curl')).toContainText('"content": "Why is the sky blue?"');
  await expect(page.getByTestId('call-node')).toContainText(`baseURL: '${baseURL}/v1'`);

  // A whole answer, bounded so it ends quickly: text streamed in, then the engine's own count and the figures.
  await page.getByLabel('Max tokens').fill('48');
  await page.getByLabel('System prompt (optional)').fill('Answer in one sentence.');
  await page.getByRole('button', { name: 'Send' }).click();
  const conversation = page.getByRole('list', { name: 'Conversation' });
  await expect(conversation.getByText('Why is the sky blue?')).toBeVisible();
  await expect(page.getByRole('button', { name: 'Send' })).toBeVisible({ timeout: 30_000 });
  await expect(page.getByRole('alert')).toHaveCount(0);
  await expect(answer(page)).not.toHaveText('');
  await expect(stats(page)).toHaveText(
    /^first token \d+ ms · [\d.]+ tokens\/s · 48 tokens · Ended at the token limit\.$/,
  );
  await snap(page, 'playground-1-answer');
  await page.setViewportSize({ width: 800, height: 800 });
  await snap(page, 'playground-2-answer-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  // The exact call, copied with its buttons, run as an application runs it with a caller-only token.
  const caller = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-playground-app", role: VIEWER, callerOnly: true }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: baseURL });
  const copied = async (button: string, testId: string) => {
    // The block the snippet is in: its button says Copied once the clipboard holds it.
    const block = page.getByTestId(testId).locator('..');
    await block.getByRole('button', { name: button }).click();
    await expect(block.getByRole('button', { name: 'Copied' })).toBeVisible();
    return await page.evaluate(() => navigator.clipboard.readText());
  };
  const curl = await copied('Copy curl', 'call-curl');
  expect(curl).toBe(await page.getByTestId('call-curl').textContent());
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HANGAR_TOKEN: caller };
  const byCurl = (await run('sh', ['-c', curl], { env, timeout: 30_000 })).stdout;
  expect(byCurl).toMatch(/"completion_tokens":\d+/);
  expect(byCurl.trimEnd().endsWith('data: [DONE]')).toBe(true);
  // The Node snippet imports `openai`: run from a folder whose node_modules holds the server's copy of it.
  const dir = await mkdtemp(path.join(os.tmpdir(), 'hangar-e2e-call-'));
  try {
    await symlink(path.resolve('../server/node_modules'), path.join(dir, 'node_modules'));
    await writeFile(path.join(dir, 'call.mjs'), await copied('Copy Node', 'call-node'));
    const byNode = (await run(process.execPath, ['call.mjs'], { cwd: dir, env, timeout: 30_000 })).stdout;
    expect(byNode).toMatch(/\n\d+ tokens\n$/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }

  // Stop, mid-answer. The tiny llama makes a few hundred tokens a second on this machine, faster than a test can
  // click; the browser's network is slowed (Chromium's own throttling, as DevTools does it) so the answer arrives
  // over seconds, as a big model's would.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false,
    latency: 0,
    downloadThroughput: 2048,
    uploadThroughput: -1,
  });
  await page.getByLabel('Max tokens').fill('400');
  await page.getByLabel('Message').fill('Tell me a long story.');
  await page.getByLabel('Message').press('Enter');
  const stop = page.getByRole('button', { name: 'Stop' });
  await expect(stop).toBeVisible();
  await expect(stats(page)).toContainText('tokens so far', { timeout: 30_000 });
  await stop.click();
  await expect(stats(page)).toHaveText(
    /^first token \d+ ms · [\d.]+ tokens\/s · \d+ tokens? \(counted as they came\) · Stopped\.$/,
  );
  const stoppedAt = await answer(page).textContent();
  await expect(page.getByRole('button', { name: 'Send' })).toBeVisible();
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false,
    latency: 0,
    downloadThroughput: -1,
    uploadThroughput: -1,
  });
  // Nothing more arrives after Stop.
  await page.waitForTimeout(1500);
  expect(await answer(page).textContent()).toBe(stoppedAt);
  const tokensShown = Number(/(\d+) tokens?/.exec((await stats(page).textContent()) ?? '')?.[1]);
  expect(tokensShown).toBeLessThan(400);
  await snap(page, 'playground-3-stopped');

  // An adapter the model does not have, named in the URL, is not offered: the playground calls the model.
  await page.goto(`/models/${MODEL}?call=no-such-adapter`);
  await expect(page.getByLabel('Model or adapter')).toHaveValue(MODEL);

  // Stopped by an operator: the gateway's refusal is shown in its own words (OpenAI's error.message).
  await gql(`mutation { setModelMode(name: "${MODEL}", mode: STOPPED) { __typename } }`);
  await expect
    .poll(
      async () =>
        (await gql(`{ model(name: "${MODEL}") { replicas { state } } }`)).data.model.replicas.every(
          (r: { state: string }) => r.state !== 'READY' && r.state !== 'LOADING',
        ),
      { timeout: 30_000, intervals: [1000] },
    )
    .toBe(true);
  await page.reload();
  await page.getByLabel('Message').fill('Hello?');
  await page.getByRole('button', { name: 'Send' }).click();
  await expect(conversation.getByRole('alert')).toHaveText(new RegExp(`^${MODEL} is stopped by an operator`));
  await snap(page, 'playground-4-refused');

  // Clean up for the specs after this one.
  expect((await gql(`mutation { removeModel(name: "${MODEL}") { __typename } }`)).data.removeModel.__typename).toBe(
    'RemovedModel',
  );
  expect(
    (await gql(`mutation { removeMirrorVersion(model: "${MODEL}", version: "v1") { __typename } }`)).data
      .removeMirrorVersion.__typename,
  ).toBe('RemovedMirrorVersion');
  // The specs after this one place replicas and read the fleet's fit: they need this node offline. A stopped agent
  // says it is leaving (leaveNode), so it is at once rather than 30 s after its last report.
  await agent?.stop();
  agent = undefined;
  await expect
    .poll(
      async () =>
        (await gql('{ nodes { name online } }')).data.nodes.some(
          (n: { name: string; online: boolean }) => n.name === NODE && n.online,
        ),
      { timeout: 60_000, intervals: [1000] },
    )
    .toBe(false);
});
