import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { expect, test } from '@playwright/test';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

// A knowledge-base collection's documents on the Organisations page: a Markdown file uploaded through the file
// input reaches the real server and is listed with its size and kind, a binary file is refused in the server's
// words next to the upload, and a document goes only after Remove is confirmed.

test('an admin uploads, lists and removes a collection’s documents on the Organisations page', async ({
  page,
  request,
}, info) => {
  const { gql } = await adminApi(request);
  await gql('mutation { createOrg(name: "e2e-kb") { __typename } }');
  const made = await gql(
    'mutation { createCollection(input: { org: "e2e-kb", name: "manuals", owner: "org:e2e-kb" }) { __typename ... on Collection { id } ... on Error { message } } }',
  );
  expect(made.data.createCollection.__typename).toBe('Collection');
  const dir = info.outputDir;
  const good = path.join(dir, 'pump-manual.md');
  const bad = path.join(dir, 'notes.txt');
  mkdirSync(dir, { recursive: true });
  writeFileSync(good, '# The pump\n\nHold the red button for five seconds to reset it.\n');
  writeFileSync(bad, Buffer.from('ABCDEFGH\u0000rest'));

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Organisations' }).click();
  const upload = page.getByLabel('Upload a document (.txt, .md, .html) to manuals');
  await upload.setInputFiles(good);
  const list = page.getByRole('list', { name: 'Documents of manuals' });
  await expect(list.getByRole('listitem')).toHaveText([/pump-manual\.md · 62 B · Markdown/]);

  await upload.setInputFiles(bad);
  await expect(page.getByRole('alert')).toHaveText(/^notes\.txt holds a NUL byte \(at byte 8\)/);
  for (const width of [1280, 800]) {
    await page.setViewportSize({ width, height: 800 });
    await expectNothingClipped(page.locator('.org-collections'));
    await snap(page, `kb-documents-${width}`);
  }

  const row = list.getByRole('listitem').filter({ hasText: 'pump-manual.md' });
  await row.getByRole('button', { name: 'Remove' }).click();
  await row
    .getByRole('group', { name: 'Remove pump-manual.md?' })
    .getByRole('button', { name: 'Remove pump-manual.md' })
    .click();
  await expect(page.getByText('No documents.')).toBeVisible();

  // orgs.spec.ts starts from a site with no organisation: leave none behind.
  const collection = made.data.createCollection.id as string;
  const gone = await gql(`mutation { deleteCollection(id: "${collection}") { __typename } }`);
  expect(gone.data.deleteCollection.__typename).toBe('Org');
  const org = (await gql('{ orgs { id name } }')).data.orgs.find((o: { name: string }) => o.name === 'e2e-kb').id;
  const orgGone = await gql(`mutation { deleteOrg(id: "${org}") { __typename ... on Error { message } } }`);
  expect(orgGone.data.deleteOrg.__typename).not.toMatch(/Error$/);
});
