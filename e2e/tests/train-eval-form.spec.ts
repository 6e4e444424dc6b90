import { expect, test } from '@playwright/test';
import { expectNothingClipped, overflows, signIn, snap } from '../fixtures/hangar.js';

// The New training job form's evaluation settings (#32): the share of the pairs held out, in percent, with what it
// comes to for the chosen file, and the seed; at the console's two widths, nothing cut or overflowing.

test('the New training job form says how many pairs are held out for the evaluation, at 1280 and 800 px', async ({
  page,
}) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Training' }).click();
  await page.getByRole('link', { name: 'New job' }).first().click();
  await expect(page.getByRole('heading', { name: 'New training job' })).toBeVisible();
  const lines = Array.from({ length: 60 }, (_, i) => JSON.stringify({ q: `What is ${i} times 3?`, a: `${3 * i}` }));
  await page.getByLabel('Pairs file', { exact: true }).setInputFiles({
    name: 'pairs.jsonl',
    mimeType: 'application/x-ndjson',
    buffer: Buffer.from(`${lines.join('\n')}\n`),
  });
  await expect(page.getByRole('region', { name: 'Report on pairs.jsonl' })).toContainText('60 pairs');
  const share = page.getByLabel('Held out for evaluation (%)', { exact: true });
  await expect(share).toHaveValue('10');
  await expect(page.getByText(/^About 6 of the 60 pairs are never trained on/)).toBeVisible();
  await share.fill('20');
  await page.getByLabel('Evaluation seed', { exact: true }).fill('7');
  await expect(page.getByText(/^About 12 of the 60 pairs are never trained on/)).toBeVisible();
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 900 });
    await share.scrollIntoViewIfNeeded();
    expect(await overflows(page)).toEqual([]);
    await expectNothingClipped(page.locator('form'));
    await snap(page, `training-new-eval-${width}`);
  }
});
