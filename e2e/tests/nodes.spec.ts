import { mkdir } from 'node:fs/promises';
import { expect, type Page, test } from '@playwright/test';
import { tinyLlama } from '../../packages/common/test/fixtures/tiny-llama.js';
import { type RunningAgent, startAgent } from '../fixtures/agent.js';
import { adminApi, signIn, snap } from '../fixtures/hangar.js';

// The Nodes page as an admin changes the fleet: a real agent declaring two GPUs gets a replica on each, the table
// shows them without an inner scrollbar at 1280 px, a node is added (with the command that starts its agent), a
// token rotated, a busy node's removal refused with its reason, the agent stopped (the node offline at once) and
// the nodes removed. Screenshots at 1280 and 800 px go to artifacts/screens and /tmp/shots-14.

const SHOTS = '/tmp/shots-14';
let agent: RunningAgent | undefined;

test.afterEach(async () => {
  await agent?.stop();
  agent = undefined;
});

async function shoot(page: Page, name: string) {
  await snap(page, name);
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
}

/** The table's own horizontal overflow, in px: what an operator would have to scroll sideways inside the page. */
const innerScroll = (page: Page) =>
  page.locator('.table-wrap').evaluate((el) => Math.max(0, el.scrollWidth - el.clientWidth));

test('an admin sees replicas per GPU, adds, rotates and removes nodes, and a stopped agent is offline at once', async ({
  page,
  request,
  baseURL,
}) => {
  test.setTimeout(180_000);
  await mkdir(SHOTS, { recursive: true });
  const { gql } = await adminApi(request);
  const nodeToken = (await gql('mutation { createNode(name: "two-gpu") { ... on CreatedNode { token } } }')).data
    .createNode.token as string;
  // Nodes made and never started, as an operator trying things leaves them.
  for (let i = 1; i <= 6; i++)
    await gql(`mutation { createNode(name: "never-started-${i}-rack-b-spare-chassis") { __typename } }`);
  const token = (
    await gql(
      'mutation { createApiToken(input: { name: "e2e-nodes", role: OPERATOR }) { ... on CreatedApiToken { secret } } }',
    )
  ).data.createApiToken.secret as string;
  const put = await request.put('/mirror/e2e-nodes/v1/tiny-llama.gguf', {
    headers: { authorization: `Bearer ${token}` },
    data: tinyLlama(),
  });
  expect(put.status()).toBe(201);
  const served = await gql(
    'mutation { serveMirrorVersion(model: "e2e-nodes", version: "v1", name: "nodes-tiny", context: 512, mode: ALWAYS, replicas: 2) { __typename ... on Error { message } } }',
  );
  expect(served.data.serveMirrorVersion.__typename).toBe('ServePlaced');
  agent = await startAgent({
    baseURL: baseURL as string,
    nodeToken,
    env: {
      HANGAR_AGENT_GPUS: JSON.stringify([
        { index: 0, name: 'Declared GPU', totalMiB: 24564, freeMiB: 20000 },
        { index: 1, name: 'Declared GPU', totalMiB: 24564, freeMiB: 20000 },
      ]),
    },
  });

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Nodes' }).click();
  const chips = page.getByRole('list', { name: 'Replicas on two-gpu' });
  await expect(async () => {
    await page.reload();
    await expect(chips).toContainText('nodes-tiny READY on GPU 0', { timeout: 2000 });
    await expect(chips).toContainText('nodes-tiny READY on GPU 1', { timeout: 2000 });
  }).toPass({ timeout: 90_000, intervals: [1000] });
  await shoot(page, 'nodes-1280');
  // Every column in view at 1280 px: no scrollbar of the table's own hides the replicas or the disk.
  expect(await innerScroll(page)).toBe(0);
  // The disk column ends inside the table's box, not past it.
  const disk = await page
    .getByRole('row', { name: /two-gpu/ })
    .getByRole('cell')
    .last()
    .boundingBox();
  const box = await page.locator('.table-wrap').boundingBox();
  expect((disk?.x ?? 0) + (disk?.width ?? 0)).toBeLessThanOrEqual((box?.x ?? 0) + (box?.width ?? 0));
  await page.setViewportSize({ width: 800, height: 900 });
  await shoot(page, 'nodes-800');
  // At 800 px each node is a block of labelled lines: nothing to scroll sideways either.
  expect(await innerScroll(page)).toBe(0);
  await page.setViewportSize({ width: 1280, height: 800 });

  // A new node, with the command that starts its agent.
  await page.getByLabel('Node name').fill('gpu-added');
  await page.getByRole('button', { name: 'Add node' }).click();
  const command = page.getByTestId('agent-command');
  await expect(command).toContainText(`HANGAR_URL=${baseURL} HANGAR_NODE_TOKEN=hgn_`);
  await expect(command).toContainText('node packages/agent/bin/hangar-agent.mjs');
  await shoot(page, 'nodes-added-1280');
  await page.getByRole('button', { name: 'I have copied it' }).click();

  // A rotated token: shown once, with the command again.
  const added = page.getByRole('row', { name: /gpu-added/ });
  await added.getByRole('button', { name: 'Rotate token' }).click();
  await added.getByRole('button', { name: 'Rotate the token of gpu-added' }).click();
  await expect(page.getByText(/A new token for “gpu-added”/)).toBeVisible();
  await expect(command).toContainText('HANGAR_NODE_TOKEN=hgn_');
  await page.getByRole('button', { name: 'I have copied it' }).click();

  // The busy node: refused, with what it runs.
  const busy = page.getByRole('row', { name: /two-gpu/ });
  await busy.getByRole('button', { name: 'Remove', exact: true }).click();
  await busy.getByRole('button', { name: 'Remove two-gpu' }).click();
  await expect(busy.getByRole('alert')).toContainText('node two-gpu still runs 2 replicas (nodes-tiny)');
  await page.setViewportSize({ width: 800, height: 900 });
  await shoot(page, 'nodes-remove-refused-800');
  await page.setViewportSize({ width: 1280, height: 800 });
  await busy.getByRole('button', { name: 'Keep it' }).click();

  // Its agent stops cleanly: offline on the next read, not 30 s later.
  await agent.stop();
  agent = undefined;
  await page.reload();
  await expect(busy.getByText('offline')).toBeVisible();
  await expect(busy.getByText(/its agent stopped/)).toBeVisible();
  await shoot(page, 'nodes-agent-stopped-1280');

  // Removed now that it runs nothing; and a never-started one.
  await busy.getByRole('button', { name: 'Remove', exact: true }).click();
  await busy.getByRole('button', { name: 'Remove two-gpu' }).click();
  await expect(page.getByRole('status').filter({ hasText: 'removed node two-gpu' })).toBeVisible();
  await expect(page.getByRole('rowheader', { name: /two-gpu/ })).toHaveCount(0);
  const spare = page.getByRole('row', { name: /never-started-1-/ });
  await spare.getByRole('button', { name: 'Remove', exact: true }).click();
  await spare.getByRole('button', { name: /^Remove never-started-1/ }).click();
  await expect(page.getByRole('rowheader', { name: /never-started-1-/ })).toHaveCount(0);
  await gql('mutation { setModelMode(name: "nodes-tiny", mode: STOPPED) { __typename } }');
});
