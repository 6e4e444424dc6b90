import { expect, test } from '@playwright/test';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

// The Limits page (#28): a limit set by a script shows with what is used of it and what it refused; an admin sets
// another on the page, sees a bad scope refused in the server's words next to the form, and removes the limits
// again. Every limit here is on this spec's own API token, so no other spec's requests are limited.

test('an admin reads, sets and removes limits on the Limits page', async ({ page, request }) => {
  const { gql } = await adminApi(request);
  const made = await gql(
    'mutation { createApiToken(input: { name: "e2e-limits-app", role: VIEWER }) { ... on CreatedApiToken { token { id } } } }',
  );
  const id = made.data.createApiToken.token.id as string;
  const set = await gql(
    `mutation { setLimit(scope: "key:${id}", limit: { requestsPerMinute: 60, concurrentRequests: 4 }) { __typename } }`,
  );
  expect(set.data.setLimit.__typename).toBe('Limit');

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Limits' }).click();
  await expect(page.getByRole('heading', { name: 'Limits', level: 1 })).toBeVisible();
  const rows = page.getByTestId('limit-row');
  await expect(rows.filter({ hasText: '60 requests / minute' })).toContainText('key:e2e-limits-app');
  await expect(rows.filter({ hasText: '4 requests at once' })).toBeVisible();

  // A scope nobody has is refused, naming the field.
  await page.getByLabel('Scope').fill('team:nobody/none');
  await page.getByLabel('Tokens / day').fill('1000');
  await page.getByRole('button', { name: 'Set limit' }).click();
  await expect(page.getByText(/^scope: /)).toBeVisible();

  // A budget for the same key, on every model, replaces what the key had there.
  await page.getByLabel('Scope').fill(`key:${id}`);
  await page.getByLabel('Tokens / day').fill('250000');
  await page.getByLabel('Spend / month').fill('12.50');
  await page.getByRole('button', { name: 'Set limit' }).click();
  await expect(page.getByRole('status')).toContainText('Set the limits of key:e2e-limits-app');
  await expect(rows.filter({ hasText: '250,000 tokens / day' })).toBeVisible();
  await expect(rows.filter({ hasText: '12.50 spend / month' })).toBeVisible();
  await snap(page, 'limits-1280');
  await page.setViewportSize({ width: 800, height: 900 });
  await expectNothingClipped(page.locator('main'));
  await snap(page, 'limits-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  // The Tokens page shows the token's own limits with what is left.
  await page.getByRole('navigation').getByRole('link', { name: 'Tokens' }).click();
  const tokenRow = page.getByRole('row', { name: /e2e-limits-app/ });
  await expect(tokenRow.getByTestId('token-limits')).toContainText('250,000 of 250,000 tokens today left');
  await snap(page, 'tokens-limits-1280');
  await page.setViewportSize({ width: 800, height: 900 });
  await snap(page, 'tokens-limits-800');
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.getByRole('navigation').getByRole('link', { name: 'Limits' }).click();

  await page
    .getByRole('row', { name: /key:e2e-limits-app/ })
    .getByRole('button', { name: 'Remove' })
    .first()
    .click();
  await expect(page.getByText('No limits: set one below.')).toBeVisible();
});
