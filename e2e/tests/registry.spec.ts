import { expect, type Locator, test } from '@playwright/test';
import { expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';
import { repoId } from '../fixtures/stand-in-hub.js';

// The registry explorer against the stand-in Hub (fixtures/stand-in-hub.ts, started by global-setup.ts): search,
// a repository opened in place, each set judged before any download, a refusal, and a fetch that lands in the mirror.

/** Where a row's top edge is in the viewport, and how far the page is scrolled. */
const place = (row: Locator) =>
  row.evaluate((el) => ({ top: Math.round(el.getBoundingClientRect().top), scrollY: Math.round(window.scrollY) }));

test('an operator finds a model in the registry, sees how each set would fit, and fetches one into the mirror', async ({
  page,
}) => {
  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Mirror' }).click();
  const explorer = page.getByRole('region', { name: 'Get from the registry' });
  await expect(explorer).toBeVisible();

  await explorer.getByLabel('Search the registry').fill('acme');
  await explorer.getByRole('button', { name: 'Search' }).click();
  await expect(page).toHaveURL(/[?&]q=acme/);
  const results = explorer.getByRole('table', { name: 'Registry repositories' });
  const toggle = results.getByRole('button', { name: repoId, exact: true });
  await expect(toggle).toBeVisible();
  await expect(results.getByRole('button', { name: /\// })).toHaveCount(5);
  const row = results.getByRole('row').filter({ has: page.getByRole('button', { name: repoId, exact: true }) });
  await expect(row).toContainText('GGUF');
  await expect(results.locator('tr', { hasText: 'acme/Gated-Llama-GGUF' })).toContainText('gated');

  // Opened in place, one at a time: the page does not jump to the top, and the row clicked stays where it was,
  // even as the repository open above it closes.
  const above = results.getByRole('button', { name: 'acme/Qwen3-8B-GGUF', exact: true });
  await above.click();
  await expect(explorer.getByRole('region', { name: 'acme/Qwen3-8B-GGUF' })).toContainText('No weights here');
  await toggle.scrollIntoViewIfNeeded();
  const before = await place(row);
  expect(before.scrollY).toBeGreaterThan(0);
  await toggle.click();
  const detail = explorer.getByRole('region', { name: repoId });
  await expect(detail).toBeVisible();
  await expect(explorer.getByRole('region', { name: 'acme/Qwen3-8B-GGUF' })).toHaveCount(0);
  await expect(page).toHaveURL(/[?&]repo=acme%2FTiny-Llama-GGUF/);
  // Within a pixel: the mirror's virtualised listing above re-measures its rows as they render (sub-pixel
  // heights); a jump would be the closed repository's whole height.
  expect(Math.abs((await place(row)).top - before.top)).toBeLessThanOrEqual(1);
  // The row right beneath the clicked one holds it.
  expect(await row.evaluate((el) => el.nextElementSibling?.querySelector('section')?.textContent ?? '')).toContain(
    repoId,
  );
  await expect(detail).toContainText('feedbee');
  await expect(detail).toContainText('LlamaForCausalLM');

  const tiny = detail.getByTestId('set-model:tiny-llama-F32');
  const qwen = detail.getByTestId('set-model:big-qwen3-Q4_K_M');
  const mmproj = detail.getByTestId('set-mmproj:mmproj-F16');
  await expect(tiny).toContainText('servable');
  await expect(tiny).toContainText('at 2,048 tokens');
  // No node reports a llama.cpp build, so the newest known one is assumed: qwen3 loads in it.
  await expect(qwen.getByText('servable', { exact: true })).toBeVisible();
  await expect(qwen).toContainText('5.0 GiB');
  await expect(qwen).toContainText(/\d+(\.\d)? GiB weights \+ [\d.]+ GiB KV \+ [\d.]+ MiB overhead at 32,768 tokens/);
  for (const set of [tiny, qwen]) await expect(set).toContainText('no node is online to place it on');
  await expect(mmproj.getByText('not servable', { exact: true })).toBeVisible();
  await expect(mmproj).toContainText('a vision/audio projector (mmproj)');
  await snap(page, '12-registry-repo-open');

  // Another context: estimated again, and kept in the URL.
  await detail.getByLabel('Context').fill('4096');
  await detail.getByRole('button', { name: 'Estimate' }).click();
  await expect(qwen).toContainText('at 4,096 tokens');
  await expect(page).toHaveURL(/[?&]ctx=4096/);

  // A set that cannot be served shows its reason and no Fetch button; forcing it is behind "Fetch anyway…" and a
  // tick that says what it means.
  await expect(mmproj.getByRole('button', { name: 'Fetch', exact: true })).toHaveCount(0);
  await mmproj.getByText('Fetch anyway…').click();
  const anyway = mmproj.getByRole('button', { name: 'Fetch anyway' });
  await expect(anyway).toBeDisabled();
  await expect(mmproj.getByLabel('Fetch it although it cannot be served here')).not.toBeChecked();
  await snap(page, '13-registry-fetch-anyway-offered');
  // Every control of every set is on screen at both widths: at 800 px the sets become cards.
  await expectNothingClipped(detail);
  await page.setViewportSize({ width: 800, height: 900 });
  await mmproj.scrollIntoViewIfNeeded();
  await page.screenshot({ path: 'artifacts/screens/13-registry-fetch-anyway-offered-800.png' });
  await tiny.scrollIntoViewIfNeeded();
  await page.screenshot({ path: 'artifacts/screens/13-registry-set-card-800.png' });
  await expectNothingClipped(detail);
  await page.setViewportSize({ width: 1280, height: 800 });

  // The small one, under the names shown: the answer stays beside it, and the mirror above lists it live.
  await expect(tiny.getByLabel('Model')).toHaveValue('tiny-llama');
  // A version per set (the revision and the quantisation): the 5 GiB qwen beside it would not land in the same one.
  await expect(tiny.getByLabel('Version')).toHaveValue('feedbee-f32');
  await expect(qwen.getByLabel('Version')).toHaveValue('feedbee-q4_k_m');
  // Other specs leave versions of their own on this server: the count is what this fetch adds.
  const facts = page.getByLabel('The mirror', { exact: true });
  const presentBefore = Number((await facts.textContent())?.match(/Present(\d+)/)?.[1]);
  expect(presentBefore).toBeGreaterThanOrEqual(0);
  await tiny.getByRole('button', { name: 'Fetch', exact: true }).click();
  await expect(detail.getByRole('status')).toContainText('started fetching 1 file into tiny-llama/feedbee-f32');
  const version = page.getByTestId('version-tiny-llama/feedbee-f32');
  await expect(version.getByText('present', { exact: true })).toBeVisible({ timeout: 30_000 });
  await expect(version.getByText('verified', { exact: true })).toBeVisible();
  await expect(detail).toContainText('tiny-llama/feedbee-f32 is now present');
  await expect(facts).toContainText(`Present${presentBefore + 1}`);
  await detail.getByText('Model card').click();
  await expect(detail.getByRole('heading', { name: 'Tiny Llama' })).toBeVisible();
  await snap(page, '14-registry-fetched');

  // The URL holds the search, the open repository and the context: a reload shows the same.
  await page.reload();
  await expect(page.getByRole('region', { name: repoId })).toBeVisible();
  await expect(page.getByLabel('Search the registry')).toHaveValue('acme');
  await expect(page.getByRole('region', { name: repoId }).getByLabel('Context')).toHaveValue('4096');
});

test('the Registry page shows a shared link’s repository, and the registry’s own failure in its place', async ({
  page,
}) => {
  await signIn(page);
  await expect(page.getByRole('navigation')).toBeVisible();
  // A link someone sent: the search and the repository open in it.
  await page.goto(`/registry?q=acme&repo=${encodeURIComponent(repoId)}`);
  await expect(page.getByRole('heading', { name: 'Registry', level: 1 })).toBeVisible();
  const detail = page.getByRole('region', { name: repoId });
  await expect(detail.getByTestId('set-model:tiny-llama-F32')).toContainText('servable');
  const button = page.getByRole('button', { name: repoId, exact: true });
  await expect(button).toHaveAttribute('aria-expanded', 'true');
  await snap(page, '15-registry-page');

  // The registry failing for one repository: its message where the repository would be; the rest stays.
  await page.getByRole('button', { name: 'acme/Broken-GGUF', exact: true }).click();
  const broken = page.getByRole('region', { name: 'acme/Broken-GGUF' });
  await expect(broken.getByRole('alert')).toContainText(/registry/i);
  await expect(page.getByRole('region', { name: repoId })).toHaveCount(0);
  await expect(page.getByRole('button', { name: repoId, exact: true })).toBeVisible();
  await snap(page, '16-registry-upstream-error');

  // One it does not have at all, from a link.
  await page.goto('/registry?q=acme&repo=acme%2FNothing-Here');
  await expect(page.getByRole('region', { name: 'acme/Nothing-Here' }).getByRole('alert')).toHaveText(
    'the registry has no repository acme/Nothing-Here',
  );
  await expect(page.getByRole('button', { name: repoId, exact: true })).toBeVisible();
});
