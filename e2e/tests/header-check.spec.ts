import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { type Browser, expect, type Page, test } from '@playwright/test';
import { type ServerProcess, startServer } from '../../server/test/fixtures/server-process.js';
import { admin, adminApi, signIn, snap } from '../fixtures/hangar.js';
import { hubUrl, wobbleFile, wobbleUrl } from '../fixtures/stand-in-hub.js';

// The look before a fetch by URL (the server reads the GGUF header over Range and refuses what the nodes'
// llama.cpp cannot load), and the explorer turned off with HANGAR_HUB_URL=off. The second needs a server set up
// that way: this spec starts one of its own on another port (its own data dir and embedded PostgreSQL), and leaves
// the main run's server as it is.

async function fetchByUrl(page: Page, model: string, url: string) {
  // ?fetch=true opens the form, whether or not the mirror holds anything yet.
  await page.goto('/mirror?fetch=true');
  const form = page.getByRole('form', { name: 'Fetch by URL' });
  await expect(form).toBeVisible();
  await form.getByLabel('Model').fill(model);
  await form.getByLabel('Version').fill('v1');
  await form.getByLabel('Source URL').fill(url);
  await form.getByRole('button', { name: 'Start fetching' }).click();
  return form;
}

test('a fetch by URL shows the header verdict first, and fetches anyway only when that is chosen', async ({ page }) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Mirror' }).click();
  const form = await fetchByUrl(page, 'e2e-wobble', wobbleUrl);
  const verdict = form.getByRole('alert');
  await expect(verdict).toContainText(`Not fetched: ${wobbleFile} cannot be served here.`);
  await expect(verdict).toContainText(/llama\.cpp \(up to b\d+\) has no architecture named wobble/);
  await expect(verdict).toContainText('Read from its header before any download.');
  // Nothing was recorded: the mirror lists no such version.
  await expect(page.getByTestId('version-e2e-wobble/v1')).toHaveCount(0);
  await snap(page, '40-fetch-by-url-verdict');
  await page.setViewportSize({ width: 800, height: 900 });
  await snap(page, '40-fetch-by-url-verdict-800');
  await page.setViewportSize({ width: 1280, height: 800 });

  await form.getByLabel('Fetch anyway, although the nodes cannot load it').check();
  await form.getByRole('button', { name: 'Fetch anyway' }).click();
  await expect(form.getByRole('status')).toHaveText('started fetching 1 file into e2e-wobble/v1');
  const version = page.getByTestId('version-e2e-wobble/v1');
  await expect(version.getByText('present', { exact: true })).toBeVisible({ timeout: 30_000 });
  await snap(page, '41-fetch-by-url-anyway');
  // Gone again: the specs after this one count what the shared server's mirror holds.
  const { gql } = await adminApi(page.request);
  const removed = await gql('mutation { removeMirrorVersion(model: "e2e-wobble", version: "v1") { __typename } }');
  expect(removed.data.removeMirrorVersion.__typename).toBe('RemovedMirrorVersion');
});

test.describe('with the registry explorer turned off (HANGAR_HUB_URL=off)', () => {
  let server: ServerProcess | undefined;
  let dataDir = '';

  test.beforeAll(async () => {
    test.setTimeout(150_000);
    // Left for the server to create, as the main run's is: a mkdtemp directory (0700) is closed to the embedded
    // PostgreSQL's own user.
    dataDir = path.join(os.tmpdir(), `hangar-e2e-off-${process.pid}`);
    await fs.rm(dataDir, { recursive: true, force: true });
    server = await startServer({ HANGAR_HUB_URL: 'off', HANGAR_DATA_DIR: dataDir }, 120_000);
  });
  test.afterAll(async () => {
    if (server) {
      server.proc.kill('SIGTERM');
      await server.exited;
    }
    if (dataDir) await fs.rm(dataDir, { recursive: true, force: true });
  });

  const openOff = async (browser: Browser) => {
    const context = await browser.newContext({ baseURL: server?.base, viewport: { width: 1280, height: 800 } });
    const page = await context.newPage();
    await signIn(page, admin.email, admin.password);
    await expect(page.getByRole('heading', { name: 'Mirror', level: 1 })).toBeVisible();
    return { context, page };
  };

  test('no Registry entry, no search box, and a mirror page that says nothing of a registry', async ({ browser }) => {
    const { context, page } = await openOff(browser);
    const nav = page.getByRole('navigation', { name: 'Main' });
    await expect(nav.getByRole('link', { name: 'Models' })).toBeVisible();
    await expect(nav.getByRole('link', { name: 'Registry' })).toHaveCount(0);
    await expect(page.getByRole('region', { name: 'Get from the registry' })).toHaveCount(0);
    await expect(page.getByLabel('Search the registry')).toHaveCount(0);
    await expect(page.locator('main')).not.toContainText(/registry/i);
    await snap(page, '42-registry-off-mirror');
    await page.setViewportSize({ width: 800, height: 900 });
    await snap(page, '42-registry-off-mirror-800');
    await page.setViewportSize({ width: 1280, height: 800 });

    // A typed link says why, with no search box to time out.
    await page.goto('/registry?q=qwen');
    await expect(page.getByText('The registry explorer is turned off on this server.')).toBeVisible();
    await expect(page.getByLabel('Search the registry')).toHaveCount(0);
    await snap(page, '43-registry-off-page');

    // The API says the same, typed.
    const r = await page.request.post('/graphql', {
      headers: { 'x-hangar-csrf': await csrfOf(page) },
      data: { query: '{ registrySearch(query: "qwen") { __typename ... on Error { message } } }' },
    });
    expect((await r.json()).data.registrySearch).toEqual({
      __typename: 'RegistryOffError',
      message: expect.stringMatching(/^the registry is turned off here \(HANGAR_HUB_URL=off\)/),
    });

    // And a fetch by URL still reads the header first: the stand-in Hub is only a URL here.
    const form = await fetchByUrl(page, 'off-wobble', `${hubUrl}/lab/Wobble-GGUF/resolve/main/${wobbleFile}`);
    await expect(form.getByRole('alert')).toContainText(/has no architecture named wobble/);
    await context.close();
  });
});

/** The session's CSRF token: a readable cookie the console copies into a header (web/src/graphql/csrf.ts). */
async function csrfOf(page: Page): Promise<string> {
  const cookie = (await page.context().cookies()).find((c) => c.name === 'hangar_csrf');
  return decodeURIComponent(cookie?.value ?? '');
}
