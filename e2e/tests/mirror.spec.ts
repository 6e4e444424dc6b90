import { createHash, randomBytes } from 'node:crypto';
import { expect, type Page, test } from '@playwright/test';
import { adminApi, signIn, snap } from '../fixtures/hangar.js';
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
  // At the field its label names: the GraphQL path the server's message starts with is for scripts.
  await expect(url).toHaveAccessibleDescription('an http:// or https:// URL');
  await expect(form.getByLabel('Model')).not.toHaveAttribute('aria-invalid');
  await snap(page, '11-mirror-fetch-refused');
});

test('a download rides out an upstream outage, saying "retrying" meanwhile, and completes unattended', async ({
  page,
}) => {
  // 2 MiB at 64 KiB every 100 ms: about three seconds of bytes, cut part-way by taking the upstream down.
  const bytes = randomBytes(2 * 1024 * 1024);
  const flaky = await startSlowUpstream({ files: { 'outage.bin': bytes } });
  try {
    await signIn(page);
    const form = await openFetchForm(page);
    await form.getByLabel('Model').fill('e2e-outage');
    await form.getByLabel('Version').fill('v1');
    await form.getByLabel('Source URL').fill(`${flaky.url}/e2e-org/e2e-outage/resolve/main/outage.bin`);
    await form.getByRole('button', { name: 'Start fetching' }).click();
    const row = page.getByTestId('version-e2e-outage/v1');
    const bar = row.getByRole('progressbar', { name: 'e2e-outage/v1 progress' });
    await expect
      .poll(async () => Number(await bar.getAttribute('aria-valuenow')), { timeout: 15_000 })
      .toBeGreaterThan(5);

    await flaky.down();
    // The truth while it is down: which try comes next, when, and why; no rate to speak of and no time left.
    const retrying = row.getByTestId('retrying');
    await expect(retrying).toContainText(
      /^retrying \(attempt \d+, (next in \d+ s|trying now)\): could not reach the upstream \(ECONNREFUSED\)$/,
      { timeout: 20_000 },
    );
    await expect(row).toContainText('fetching');
    await expect(row).not.toContainText('left');
    await snap(page, '12-mirror-retrying');
    await page.setViewportSize({ width: 800, height: 800 });
    await snap(page, '12-mirror-retrying-800');
    await page.setViewportSize({ width: 1280, height: 800 });

    await flaky.up();
    // Nobody touches it: the next try finds the upstream and goes on from the partial.
    await expect(row.getByText('present', { exact: true })).toBeVisible({ timeout: 45_000 });
    await expect(row.getByText('verified', { exact: true })).toBeVisible();
    await expect(retrying).toHaveCount(0);
    expect(flaky.requests.at(-1)).toMatch(/ bytes=[1-9]\d*-$/);
  } finally {
    await flaky.close();
  }
});

test('an operator pauses a download and resumes it, and limits the mirror’s bandwidth', async ({ page }) => {
  const bytes = randomBytes(3 * 1024 * 1024);
  const slow = await startSlowUpstream({ files: { 'paused.bin': bytes } });
  try {
    await signIn(page);
    const form = await openFetchForm(page);
    await form.getByLabel('Model').fill('e2e-paused');
    await form.getByLabel('Version').fill('v1');
    await form.getByLabel('Source URL').fill(`${slow.url}/e2e-org/e2e-paused/resolve/main/paused.bin`);
    await form.getByRole('button', { name: 'Start fetching' }).click();
    const row = page.getByTestId('version-e2e-paused/v1');
    const bar = row.getByRole('progressbar', { name: 'e2e-paused/v1 progress' });
    await expect
      .poll(async () => Number(await bar.getAttribute('aria-valuenow')), { timeout: 15_000 })
      .toBeGreaterThan(5);

    await row.getByRole('button', { name: 'Pause' }).click();
    await expect(row.getByText('paused', { exact: true })).toBeVisible();
    await expect(row).toContainText(/ kept/);
    await snap(page, '13-mirror-paused');
    await row.getByRole('button', { name: 'Resume' }).click();
    await expect(row.getByText('present', { exact: true })).toBeVisible({ timeout: 45_000 });
    // Resumed from the partial: the last request asked for the rest only.
    expect(slow.requests.at(-1)).toMatch(/ bytes=[1-9]\d*-$/);

    await page.getByRole('button', { name: 'Change' }).click();
    const limit = page.getByRole('form', { name: 'Download limit' });
    await limit.getByLabel('MB/s').fill('50');
    await limit.getByRole('button', { name: 'Set' }).click();
    await expect(page.getByText('Download limit: 50 MB/s')).toBeVisible();
    await snap(page, '14-mirror-limit');
    await page.getByRole('button', { name: 'Change' }).click();
    await page.getByRole('form', { name: 'Download limit' }).getByRole('button', { name: 'No limit' }).click();
    await expect(page.getByText('Download limit: none')).toBeVisible();
  } finally {
    await slow.close();
  }
});

test('the Mirror page puts every version under its own family, counts what each holds, and filters', async ({
  page,
  request,
}) => {
  const { gql } = await adminApi(request);
  // Small files that arrive at once, and one large file sent slowly enough to be still arriving at the screenshot.
  const quick = await startSlowUpstream({ files: { 'small.gguf': randomBytes(256 * 1024) }, chunkBytes: 1 << 20 });
  const slow = await startSlowUpstream({
    files: { 'big.gguf': randomBytes(8 * 1024 * 1024) },
    chunkBytes: 16 * 1024,
    intervalMs: 200,
  });
  const fetch = async (model: string, version: string, url: string) => {
    const r = await gql(
      `mutation($model: String!, $version: String!, $url: String!) {
        fetchToMirror(model: $model, version: $version, sources: [{ url: $url }], fetchAnyway: true) { __typename }
      }`,
      { model, version, url },
    );
    expect(r.data.fetchToMirror.__typename).toBe('FetchStarted');
  };
  const held: [string, string][] = [
    ['qwen3-8b', 'Q4_K_M'],
    ['qwen3-8b', 'Q8_0'],
    ['qwen2.5-coder-7b', 'Q4_K_M'],
    ['tiny-llama', 'v1'],
    ['mistral-7b', 'Q4_K_M'],
    ['ops-runbook', 'v1'],
    ['llama3.1-8b', 'Q4_K_M'],
  ];
  const all: [string, string][] = [...held, ['mistral-7b', 'Q8_0'], ['qwen3-8b', 'Q6_K']];
  // Other specs leave versions of their own on this server: the counts are what this one adds to them.
  const counted = (await gql('{ mirror { present failed } }')).data.mirror as { present: number; failed: number };
  try {
    for (const [model, version] of held) await fetch(model, version, `${quick.url}/${model}/resolve/main/small.gguf`);
    // The upstream has no such file: it fails at once, with its reason.
    await fetch('mistral-7b', 'Q8_0', `${quick.url}/mistral-7b/resolve/main/missing.gguf`);
    await fetch('qwen3-8b', 'Q6_K', `${slow.url}/qwen3-8b/resolve/main/big.gguf`);

    // Tall enough for every row: the listing renders only the rows in the window (and a few beyond).
    await page.setViewportSize({ width: 1280, height: 1600 });
    await signIn(page);
    await page.getByRole('navigation').getByRole('link', { name: 'Mirror' }).click();
    await expect(page.getByLabel('The mirror')).toContainText(`Present${counted.present + 7}`, { timeout: 30_000 });
    await expect(page.getByLabel('The mirror')).toContainText(`Failed${counted.failed + 1}`);
    await expect(page.getByTestId('version-qwen3-8b/Q6_K').getByRole('progressbar')).toBeVisible();

    // Each row under its own family's heading, families by name and rows by name, a family of one included.
    // This spec's rows only (others, all named e2e-…, are in their own family).
    const mine = new Set(all.map(([model, version]) => `${model}/${version}`));
    const familyOfEachRow = async () =>
      (
        await page.evaluate(() => {
          const out: { family: string; id: string }[] = [];
          let family = '';
          for (const el of document.querySelectorAll('tr.family, tr[data-testid^="version-"]')) {
            if (el.classList.contains('family')) family = el.querySelector('.family-toggle')?.textContent ?? '';
            else out.push({ family, id: (el as HTMLElement).dataset.testid?.slice('version-'.length) ?? '' });
          }
          return out;
        })
      )
        .filter((row) => mine.has(row.id))
        .map((row) => `${row.family}: ${row.id}`);
    expect(await familyOfEachRow()).toEqual([
      'llama: llama3.1-8b/Q4_K_M',
      'mistral: mistral-7b/Q4_K_M',
      'mistral: mistral-7b/Q8_0',
      'ops: ops-runbook/v1',
      'qwen: qwen2.5-coder-7b/Q4_K_M',
      'qwen: qwen3-8b/Q4_K_M',
      'qwen: qwen3-8b/Q6_K',
      'qwen: qwen3-8b/Q8_0',
      'tiny: tiny-llama/v1',
    ]);
    const heading = (name: string) => page.getByRole('heading', { name: new RegExp(`^${name}`) });
    await expect(heading('qwen')).toContainText('2 models · 4 versions');
    await expect(heading('qwen')).toContainText('1 fetching');
    await expect(heading('mistral')).toContainText('1 failed');
    await expect(heading('tiny')).toContainText('1 model · 1 version');
    for (const width of [1280, 800]) {
      await page.setViewportSize({ width, height: 1600 });
      await page.screenshot({ path: `/tmp/shots-mirror/mirror-families-${width}.png`, fullPage: true });
    }
    await page.setViewportSize({ width: 1280, height: 1600 });
    await snap(page, '12-mirror-families');

    // The row groups are placed one under another (each is out of the table's flow, mirror-table.tsx): none
    // overlaps the one before it or leaves a gap, at either width. Opened to its files, a row pushes the rest down.
    for (const width of [1280, 800]) {
      await page.setViewportSize({ width, height: 1600 });
      await expect.poll(() => misplacedRowGroups(page)).toEqual([]);
    }
    await page.setViewportSize({ width: 1280, height: 1600 });
    const opened = page.getByTestId('version-qwen3-8b/Q4_K_M');
    const next = page.getByTestId('version-qwen3-8b/Q6_K');
    const nextTop = async () => (await next.boundingBox())?.y ?? 0;
    const closedTop = await nextTop();
    await opened.getByRole('button', { name: '1 file' }).click();
    await expect(page.getByRole('table', { name: 'Files of qwen3-8b/Q4_K_M' })).toBeVisible();
    await expect.poll(nextTop).toBeGreaterThan(closedTop + 40);
    expect(await misplacedRowGroups(page)).toEqual([]);
    await opened.getByRole('button', { name: '1 file' }).click();
    await expect.poll(nextTop).toBe(closedTop);

    // Bytes tick on the arriving row: nothing moves.
    const before = await familyOfEachRow();
    const bar = page.getByTestId('version-qwen3-8b/Q6_K').getByRole('progressbar');
    const first = Number(await bar.getAttribute('aria-valuenow'));
    await expect
      .poll(async () => Number(await bar.getAttribute('aria-valuenow')), { timeout: 15_000 })
      .toBeGreaterThan(first);
    expect(await familyOfEachRow()).toEqual(before);

    await page.getByRole('searchbox', { name: 'Name' }).fill('llama');
    expect(await familyOfEachRow()).toEqual(['llama: llama3.1-8b/Q4_K_M', 'tiny: tiny-llama/v1']);
    await page.getByRole('searchbox', { name: 'Name' }).fill('');
    await page.getByRole('combobox', { name: 'State' }).selectOption('failed');
    await expect(page.getByTestId('version-mistral-7b/Q8_0')).toContainText('404');
    expect(await familyOfEachRow()).toEqual(['mistral: mistral-7b/Q8_0']);
    // The filter is in the URL: a reload keeps it.
    await page.reload();
    await expect(page.getByRole('combobox', { name: 'State' })).toHaveValue('failed');
    await expect(page.getByTestId('version-mistral-7b/Q8_0')).toBeVisible();
    expect(await familyOfEachRow()).toEqual(['mistral: mistral-7b/Q8_0']);
    await page.setViewportSize({ width: 800, height: 1000 });
    await page.screenshot({ path: '/tmp/shots-mirror/mirror-filtered-800.png', fullPage: true });
  } finally {
    await gql('mutation { cancelMirrorFetch(model: "qwen3-8b", version: "Q6_K") { __typename } }');
    for (const [model, version] of all) {
      await gql(
        'mutation($m: String!, $v: String!) { removeMirrorVersion(model: $m, version: $v, force: true) { __typename } }',
        {
          m: model,
          v: version,
        },
      );
    }
    await quick.close();
    await slow.close();
  }
});

/**
 * Where the Mirror listing's row groups are not stacked: a group whose top is not where the one above it ends (the
 * table's head, for the listing's first), or that runs past the table's bottom. Each is said as "the row: how far
 * off".
 */
function misplacedRowGroups(page: Page) {
  return page.evaluate(() => {
    const table = document.querySelector('table.mirror') as HTMLElement;
    const out: string[] = [];
    const groups = [...table.querySelectorAll<HTMLElement>(':scope > tbody')];
    // The first group rendered follows the head only when it is the listing's first row.
    let above =
      groups[0]?.dataset.index === '0'
        ? table.querySelector(':scope > thead')?.getBoundingClientRect().bottom
        : undefined;
    for (const group of groups) {
      const box = group.getBoundingClientRect();
      const row = group.querySelector<HTMLElement>('[data-testid], .family-toggle');
      const label = row?.dataset.testid ?? row?.textContent ?? '?';
      if (above !== undefined && Math.abs(box.top - above) > 1) out.push(`${label}: ${Math.round(box.top - above)} px`);
      above = box.bottom;
    }
    if (above !== undefined && above > table.getBoundingClientRect().bottom + 1) {
      out.push('the table ends above its last row group');
    }
    return out;
  });
}
