import { expect, test } from '@playwright/test';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

// The Cost page (#28): an admin reads the cost report (totals, the chart over time, lines grouped as asked) and the
// prices it is computed from, sets a node's and a GPU model's price on the page, sees a price that is not a decimal
// refused in the server's words, and removes the prices again. A price set by a script shows as the page's do.

test('an admin reads the cost report and sets prices on the Cost page', async ({ page, request }) => {
  const { gql } = await adminApi(request);
  const set = await gql(
    'mutation { setModelPrice(model: "e2e-cost-model", perMillionPromptTokens: "0.10", perMillionCompletionTokens: "0.30") { __typename } }',
  );
  expect(set.data.setModelPrice.__typename).toBe('Price');

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Cost' }).click();
  await expect(page.getByRole('heading', { name: 'Cost', level: 1 })).toBeVisible();
  // The report: totals in the site's currency and the chart of the range, step by step.
  await expect(page.getByTestId('cost-totals')).toContainText('USD');
  await expect(page.getByRole('figure', { name: /Cost over time/ })).toBeVisible();
  await expect(
    page.getByRole('img', { name: /Cost per step: calls [0-9.]+ USD, idle [0-9.]+ USD, over 2[45] steps/ }),
  ).toBeVisible();
  const prices = page.getByTestId('price-row');
  await expect(prices.filter({ hasText: 'e2e-cost-model' })).toContainText('0.10 USD');

  // A price that is not a decimal is refused, naming the field.
  await page.getByLabel('Name').fill('e2e-gpu-1');
  await page.getByLabel('Per GPU-hour').fill('2,40');
  await page.getByRole('button', { name: 'Set price' }).click();
  await expect(page.getByText(/perGpuHour: a price is a non-negative decimal/)).toBeVisible();

  await page.getByLabel('Per GPU-hour').fill('2.40');
  await page.getByRole('button', { name: 'Set price' }).click();
  await expect(page.getByRole('status')).toContainText('Set the price of e2e-gpu-1.');
  await expect(prices.filter({ hasText: 'e2e-gpu-1' })).toContainText('2.40 USD');

  await page.getByLabel('For').selectOption('GPU');
  await page.getByLabel('Name').fill('NVIDIA L4');
  await page.getByLabel('Per GPU-hour').fill('0.80');
  await page.getByRole('button', { name: 'Set price' }).click();
  await expect(prices.filter({ hasText: 'NVIDIA L4' })).toContainText('0.80 USD');

  // Another grouping and a longer range ask again.
  await page.getByLabel('Group by').selectOption('TEAM');
  await page.getByLabel('Range').selectOption('week');
  await expect(page.getByRole('img', { name: /over 2[89] steps/ })).toBeVisible();
  await snap(page, 'cost-1280');
  await page.setViewportSize({ width: 800, height: 900 });
  await expectNothingClipped(page.locator('main'));
  await snap(page, 'cost-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  // Removed again (an empty price), so no other spec sees them.
  for (const q of [
    'mutation { setNodePrice(node: "e2e-gpu-1") { __typename } }',
    'mutation { setGpuPrice(gpu: "NVIDIA L4") { __typename } }',
    'mutation { setModelPrice(model: "e2e-cost-model") { __typename } }',
  ]) {
    await gql(q);
  }
  await page.reload();
  await expect(page.getByText('No prices yet')).toBeVisible();
});
