import { expect, test } from '@playwright/test';
import { adminApi, expectNothingClipped, overflows, signIn, snap } from '../fixtures/hangar.js';

test('GraphiQL at /graphql runs a query with the console session', async ({ page }) => {
  await signIn(page);
  await expect(page.getByRole('navigation')).toBeVisible();
  // What GraphiQL sends, to see that the session's CSRF header rides with it.
  const sent: { method: string; csrf: string | undefined }[] = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname === '/graphql' && r.resourceType() === 'fetch') {
      sent.push({ method: r.method(), csrf: r.headers()['x-hangar-csrf'] });
    }
  });
  await page.goto('/graphql');
  const editor = page.locator('.graphiql-query-editor').first();
  await expect(editor).toBeVisible();
  const response = page.locator('.graphiql-response');
  const run = async (operation: string) => {
    await editor.click();
    await page.keyboard.press('ControlOrMeta+A');
    await page.keyboard.press('Delete');
    await page.keyboard.type(operation);
    await page.getByRole('button', { name: /Execute query/ }).click();
  };
  await run('{ viewer { role } }');
  await expect(response).toContainText('"role": "ADMIN"');
  await expect(response).not.toContainText('errors');
  // A query may go as a GET, which the cookie alone identifies; a mutation is a POST, refused as anonymous
  // without the session's CSRF header.
  await run('mutation { createApiToken(input: { name: "from-graphiql", role: VIEWER }) { __typename } }');
  await expect(response).toContainText('"__typename": "CreatedApiToken"');
  await expect(response).not.toContainText('errors');
  await snap(page, 'graphiql-signed-in');
  const posts = sent.filter((s) => s.method === 'POST');
  expect(posts.length).toBeGreaterThan(0);
  expect(posts.every((s) => typeof s.csrf === 'string' && s.csrf.length > 10)).toBe(true);
});

const LONG = 'a-rather-long-name.of-an-operator@operations.example.com';

test('passwords: an admin resets one from the Users page, a user changes their own from Account', async ({
  page,
  browser,
}) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Users' }).click();
  const create = page.getByRole('region', { name: 'Create a user' });
  await create.getByLabel('Email').fill(LONG);
  await create.getByLabel('Name').fill('Long Name');
  await create.getByLabel('Password').fill('the first password');
  await create.getByRole('button', { name: 'Create user' }).click();
  const row = page.getByRole('row', { name: new RegExp(LONG) });
  await expect(row).toBeVisible();

  // They sign in elsewhere; the reset ends that session.
  const theirs = await browser.newContext();
  const them = await theirs.newPage();
  await signIn(them, LONG, 'the first password');
  await expect(them.getByRole('navigation')).toBeVisible();

  await row.getByRole('button', { name: 'Reset password' }).click();
  const reset = page.getByRole('form', { name: `Reset the password of ${LONG}` });
  await reset.getByLabel(`New password for ${LONG}`).fill('the reset password');
  await reset.getByRole('button', { name: 'Set password' }).click();
  await expect(page.getByRole('status').filter({ hasText: 'Password reset' })).toContainText(
    `Password reset: ${LONG} was signed out everywhere`,
  );
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    expect(await overflows(page)).toEqual([]);
    await snap(page, `users-${width}`);
  }
  await page.setViewportSize({ width: 1280, height: 800 });
  await them.reload();
  await expect(them.getByRole('button', { name: 'Sign in' })).toBeVisible();

  // Their own change, from the Account page their email links to.
  await signIn(them, LONG, 'the reset password');
  await them.getByRole('link', { name: LONG }).click();
  await expect(them.getByRole('heading', { name: 'Account' })).toBeVisible();
  await them.getByLabel('Current password').fill('the reset password');
  await them.getByLabel('New password', { exact: true }).fill('my own new password');
  await them.getByLabel('New password again').fill('my own new password');
  await them.getByRole('button', { name: 'Change password' }).click();
  await expect(them.getByRole('status')).toContainText('Password changed.');
  await snap(them, 'account-password-changed');
  await them.getByRole('button', { name: 'Sign out' }).click();
  // Signing out loads /login afresh; a navigation started before it lands would be cut short.
  await expect(them.getByRole('button', { name: 'Sign in' })).toBeVisible();
  await signIn(them, LONG, 'my own new password');
  await expect(them.getByRole('navigation')).toBeVisible();
  await theirs.close();
});

test('the audit log filters, keeps emails whole, and fits at 1280 and 800 px', async ({ page, request }) => {
  const { gql } = await adminApi(request);
  await gql('mutation { createApiToken(input: { name: "audit-filter-probe", role: VIEWER }) { __typename } }');
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Audit' }).click();
  const table = page.getByRole('table');
  await expect(table.getByRole('row').nth(1)).toBeVisible();

  const filter = page.getByRole('form', { name: 'Filter the audit log' });
  await filter.getByLabel('Action').fill('login');
  await filter.getByLabel('Outcome').selectOption('DONE');
  await filter.getByRole('button', { name: 'Filter' }).click();
  await expect(page).toHaveURL(/action=login/);
  const rows = table.locator('tbody tr');
  await expect(rows.filter({ hasText: 'login' }).first()).toBeVisible();
  expect(await rows.filter({ hasNotText: 'login' }).count()).toBe(0);
  expect(await rows.filter({ hasText: 'REFUSED' }).count()).toBe(0);
  // A reload keeps the filter: it lives in the URL.
  await page.reload();
  await expect(filter.getByLabel('Action')).toHaveValue('login');
  await expect(rows.filter({ hasText: 'login' }).first()).toBeVisible();
  expect(await rows.filter({ hasText: 'createApiToken' }).count()).toBe(0);
  await filter.getByRole('button', { name: 'Clear' }).click();
  await expect(rows.filter({ hasText: 'audit-filter-probe' }).first()).toBeVisible();

  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    expect(await overflows(page)).toEqual([]);
    // An email breaks only after its "@", ":" and dots, never letter by letter: each part between them stays on
    // one line (a part broken across lines has more than one box).
    const broken = await table
      .locator('td.mono > span')
      .evaluateAll((parts) => parts.filter((p) => p.getClientRects().length > 1).map((p) => p.textContent));
    expect(broken).toEqual([]);
    // The message is read, not squeezed: at 800 px each event is a card with its message across it.
    const share = await table
      .locator('td.message')
      .first()
      .evaluate((m) => m.getBoundingClientRect().width / (m.closest('table')?.getBoundingClientRect().width ?? 1));
    expect(share).toBeGreaterThan(width === 800 ? 0.8 : 0.15);
    await expectNothingClipped(table);
    await snap(page, `audit-${width}`);
  }
  // The sidebar's column is painted to the bottom of the page, however long.
  await page.setViewportSize({ width: 1280, height: 500 });
  const shell = await page.evaluate(() => {
    const s = document.querySelector('.shell') as HTMLElement;
    return {
      height: s.offsetHeight,
      page: document.documentElement.scrollHeight,
      bg: getComputedStyle(s).backgroundImage,
    };
  });
  expect(shell.height).toBe(shell.page);
  expect(shell.page).toBeGreaterThan(500);
  expect(shell.bg).toContain('linear-gradient');
});
