import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { expect, test } from '@playwright/test';
import { adminApi, expectNothingClipped, signIn, snap } from '../fixtures/hangar.js';

// A knowledge-base collection's documents on the Organisations page: a Markdown file and a PDF uploaded through
// the file input reach the real server and are listed with their size and kind, a binary file is refused in the
// server's words next to the upload, and a document goes only after Remove is confirmed.

/** A one-page PDF with a line of text, as a PDF writer lays it out (objects, then the xref table of their offsets). */
function onePagePdf(line: string): Buffer {
  const stream = `BT /F1 12 Tf 72 720 Td (${line}) Tj ET`;
  const objects = [
    '<< /Type /Catalog /Pages 2 0 R >>',
    '<< /Type /Pages /Kids [3 0 R] /Count 1 >>',
    '<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>',
    '<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>',
    `<< /Length ${stream.length} >>\nstream\n${stream}\nendstream`,
  ];
  let out = '%PDF-1.4\n';
  const offsets = objects.map((body, i) => {
    const at = out.length;
    out += `${i + 1} 0 obj\n${body}\nendobj\n`;
    return at;
  });
  const xref = out.length;
  out += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n`;
  for (const at of offsets) out += `${String(at).padStart(10, '0')} 00000 n \n`;
  out += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(out, 'latin1');
}

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
  const pdf = path.join(dir, 'pump-warranty.pdf');
  const pdfBytes = onePagePdf('The pump is under warranty for two years.');
  writeFileSync(pdf, pdfBytes);

  await signIn(page);
  await page.getByRole('navigation').getByRole('link', { name: 'Organisations' }).click();
  const upload = page.getByLabel('Upload a document (.txt, .md, .html, .pdf) to manuals');
  await upload.setInputFiles(good);
  const list = page.getByRole('list', { name: 'Documents of manuals' });
  await expect(list.getByRole('listitem')).toHaveText([/pump-manual\.md · 62 B · Markdown/]);
  await upload.setInputFiles(pdf);
  await expect(list.getByRole('listitem')).toHaveText([
    /pump-manual\.md · 62 B · Markdown/,
    new RegExp(`pump-warranty\\.pdf · ${pdfBytes.length} B · PDF`),
  ]);

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
  await expect(list.getByRole('listitem')).toHaveText([/pump-warranty\.pdf/]);

  // orgs.spec.ts starts from a site with no organisation: leave none behind.
  const collection = made.data.createCollection.id as string;
  const gone = await gql(`mutation { deleteCollection(id: "${collection}") { __typename } }`);
  expect(gone.data.deleteCollection.__typename).toBe('Org');
  const org = (await gql('{ orgs { id name } }')).data.orgs.find((o: { name: string }) => o.name === 'e2e-kb').id;
  const orgGone = await gql(`mutation { deleteOrg(id: "${org}") { __typename ... on Error { message } } }`);
  expect(orgGone.data.deleteOrg.__typename).not.toMatch(/Error$/);
});
