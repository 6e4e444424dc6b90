import { createHash, randomBytes } from 'node:crypto';
import { expect, type Page, test } from '@playwright/test';
import { signIn, snap } from '../fixtures/hangar.js';
import { type SlowUpstream, startSlowUpstream } from '../fixtures/slow-upstream.js';

// 3 MiB at 64 KiB every 100 ms: about five seconds, long enough to see the bar move and short enough to wait for.
const weights = randomBytes(3 * 1024 * 1024);
let upstream: SlowUpstream;

test.beforeAll(async () => {
  upstream = await startSlowUpstream({ files: { 'weights.bin': weights } });
});

test.afterAll(async () => {
  await upstream?.close();
});

/** The Mirror page, with its fetch form open (an empty mirror opens it by itself). */
async function openFetchForm(page: Page) {
  await page.getByRole('navigation').getByRole('link', { name: 'Mirror' }).click();
  await expect(page.getByText('The mirror holds nothing yet.').or(page.getByRole('table').first())).toBeVisible();
  const form = page.getByRole('form', { name: 'Fetch by URL' });
  if (!(await form.isVisible())) await page.getByRole('button', { name: 'Fetch by URL' }).click();
  await expect(form).toBeVisible();
  return form;
}

test('an operator fetches a file by URL, watches it arrive, gets it from the mirror, and removes it', async ({
  page,
  request,
  baseURL,
}) => {
  const sha256 = createHash('sha256').update(weights).digest('hex');
  await signIn(page);
  const form = await openFetchForm(page);

  await form.getByLabel('Model').fill('e2e-model');
  await form.getByLabel('Version').fill('v1');
  await form.getByLabel('Source URL').fill(`${upstream.url}/e2e-org/e2e-model/resolve/main/weights.bin`);
  await form.getByRole('button', { name: 'Start fetching' }).click();
  // Named as started: the bytes are still moving.
  await expect(form.getByRole('status')).toHaveText('started fetching 1 file into e2e-model/v1');

  const row = page.getByTestId('version-e2e-model/v1');
  await expect(row).toBeVisible();
  const bar = row.getByRole('progressbar', { name: 'e2e-model/v1 progress' });
  await expect(bar).toBeVisible({ timeout: 10_000 });
  const first = Number(await bar.getAttribute('aria-valuenow'));
  await expect
    .poll(async () => Number(await bar.getAttribute('aria-valuenow')), { timeout: 10_000 })
    .toBeGreaterThan(first);
  await expect(row).toContainText('fetching');
  await expect(row).toContainText(/\d+(\.\d)? [KM]iB\/s/);
  await snap(page, '07-mirror-fetching');

  // Without a reload: the subscription turns the row present, checked against the upstream's X-Linked-Etag.
  await expect(row.getByText('present', { exact: true })).toBeVisible({ timeout: 30_000 });
  await expect(row.getByText('verified', { exact: true })).toBeVisible();
  await expect(bar).toHaveCount(0);
  await expect(row).toContainText(`${baseURL}/mirror/e2e-model/v1/`);
  await expect(page.getByLabel('The mirror')).toContainText('Present1');
  await row.getByRole('button', { name: '1 file' }).click();
  await expect(page.getByRole('table', { name: 'Files of e2e-model/v1' })).toContainText(sha256.slice(0, 12));
  await snap(page, '08-mirror-present');

  // What a node gets: the same bytes, with the digest the mirror verified as its ETag. The mirror asks for a
  // credential by default: the console's session is one (page.request sends the page's cookies), none is not.
  expect((await request.get('/mirror/e2e-model/v1/weights.bin')).status()).toBe(401);
  const served = await page.request.get('/mirror/e2e-model/v1/weights.bin');
  expect(served.status()).toBe(200);
  expect(
    createHash('sha256')
      .update(await served.body())
      .digest('hex'),
  ).toBe(sha256);
  expect(served.headers().etag).toBe(`"${sha256}"`);

  await row.getByRole('button', { name: 'Remove' }).click();
  const dialog = page.getByRole('alertdialog', { name: 'Remove e2e-model/v1 (3.0 MiB)?' });
  await expect(dialog).toBeVisible();
  await snap(page, '09-mirror-remove-confirm');
  await dialog.getByRole('button', { name: 'Remove' }).click();
  await expect(row).toHaveCount(0);
  await expect(page.getByText('The mirror holds nothing yet.')).toBeVisible();
  await expect(page.getByLabel('The mirror')).toContainText('Present0');
  expect((await page.request.get('/mirror/e2e-model/v1/weights.bin')).status()).toBe(404);
  await snap(page, '10-mirror-removed');
});

test('the fetch form shows the server’s refusal next to the field it names', async ({ page }) => {
  await signIn(page);
  const form = await openFetchForm(page);
  await form.getByLabel('Model').fill('e2e-model');
  await form.getByLabel('Version').fill('v2');
  await form.getByLabel('Source URL').fill('ftp://example.com/weights.bin');
  await form.getByRole('button', { name: 'Start fetching' }).click();

  const url = form.getByLabel('Source URL');
  await expect(url).toHaveAttribute('aria-invalid', 'true');
  await expect(url).toHaveAccessibleDescription('sources.0.url: an http:// or https:// URL');
  await expect(form.getByLabel('Model')).not.toHaveAttribute('aria-invalid');
  await snap(page, '11-mirror-fetch-refused');
});
