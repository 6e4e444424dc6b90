import { expect, test } from '@playwright/test';
import { admin, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

test('a wrong password is refused with the reason, and the refusal is audited', async ({ page }) => {
  await signIn(page, admin.email, 'not the password');
  await expect(page.getByRole('alert')).toContainText('wrong email or password');
  await snap(page, '01-sign-in-refused');
});

test('an operator signs in, makes a token, uses it, revokes it, and finds both in the audit log', async ({
  page,
  request,
}) => {
  await signIn(page);
  const nav = page.getByRole('navigation');
  for (const name of ['Mirror', 'Registry', 'Models', 'Nodes', 'Training', 'Audit', 'Tokens', 'Users']) {
    await expect(nav.getByRole('link', { name })).toBeVisible();
  }
  await expect(page.getByText(admin.email)).toBeVisible();
  await snap(page, '02-shell');

  await nav.getByRole('link', { name: 'Tokens' }).click();
  await page.getByLabel('Token name').fill('e2e-script');
  await page.getByLabel('Role').selectOption('VIEWER');
  await page.getByRole('button', { name: 'Create token' }).click();
  const secret = ((await page.getByTestId('token-secret').textContent()) ?? '').trim();
  expect(secret).toMatch(/^hgr_/);
  await snap(page, '03-token-created');

  // What a script does with it: curl-equivalent, a plain POST with the bearer token.
  const asScript = await request.post('/graphql', {
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    data: { query: '{ viewer { role tokenName user { email } } }' },
  });
  expect(await asScript.json()).toEqual({
    data: { viewer: { role: 'VIEWER', tokenName: 'e2e-script', user: { email: admin.email } } },
  });

  // The secret is shown once: after a reload only its prefix remains.
  await page.reload();
  await expect(page.getByTestId('token-secret')).toHaveCount(0);
  const row = page.getByRole('row', { name: /e2e-script/ });
  // Its day's usage, read from the server: a GraphQL call is not a model request.
  await expect(row.getByTestId('token-usage')).toHaveText('no requests');
  // Every token's Revoke is on screen at both widths: at 800 px each token is a card, with no sideways scroll.
  const tokens = page.getByRole('table').first();
  await expectNothingClipped(tokens);
  await page.setViewportSize({ width: 800, height: 900 });
  await expectNothingClipped(tokens);
  await snap(page, '03-tokens-800');
  await page.setViewportSize({ width: 1280, height: 800 });
  await row.getByRole('button', { name: 'Revoke' }).click();
  await expect(row).toContainText(/revoked/i);
  await snap(page, '04-token-revoked');

  const afterRevoke = await request.post('/graphql', {
    headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
    data: { query: '{ nodes { id } }' },
  });
  expect(JSON.stringify(await afterRevoke.json())).toContain('was revoked');

  await nav.getByRole('link', { name: 'Audit' }).click();
  const table = page.getByRole('table');
  await expect(table.getByRole('row', { name: /revokeApiToken/ }).first()).toContainText('e2e-script');
  await expect(table.getByRole('row', { name: /createApiToken/ }).first()).toContainText('e2e-script');
  await expect(table.getByRole('row', { name: /login.*REFUSED|REFUSED.*login/ }).first()).toBeVisible();
  await snap(page, '05-audit');
});

test('the audit page shows events as they happen', async ({ page, request }) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Audit' }).click();
  await expect(page.getByRole('table')).toBeVisible();
  await expect(page.getByText('Live: new events appear at the top.')).toBeVisible();
  // Something happens elsewhere: a script signs in with a wrong password. The page is never reloaded, so the row
  // can only arrive over the subscription; the attempt is repeated in case it raced the subscription's start.
  await expect(async () => {
    await request.post('/graphql', {
      headers: { 'content-type': 'application/json' },
      data: { query: 'mutation { login(email: "intruder@example.com", password: "guess") { __typename } }' },
    });
    await expect(page.getByRole('row', { name: /intruder@example\.com/ }).first()).toBeVisible({ timeout: 2000 });
  }).toPass({ timeout: 20_000 });
  await snap(page, '06-audit-live');
});
