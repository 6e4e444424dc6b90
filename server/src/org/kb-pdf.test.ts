import { expect, it } from 'vitest';
import { passwordPdf, scannedPdf, textPdf } from '../../test/fixtures/pdfs.js';
import { PDF_LIMITS, pdfText } from './kb-pdf.js';

// A PDF's text layer read by PDF.js, within the limits, on PDFs pdf-lib writes at test time; the flow through
// addDocument (owners, audit, the stored text) is in kb-documents.test.ts.

const limits = { ...PDF_LIMITS, maxTextBytes: 100_000 };

it('reads the text of every page, in order, a blank line between pages', async () => {
  const pdf = await textPdf([
    ['Returns are accepted within 30 days.', 'Bring the receipt.'],
    ['Warranty: two years on every device.'],
  ]);
  const read = await pdfText('policy.pdf', pdf, limits);
  expect(read).toEqual({
    pages: 2,
    text: expect.stringMatching(
      /^Returns are accepted within 30 days\.\s*\nBring the receipt\.\s*\n\nWarranty: two years on every device\.\s*$/,
    ),
  });
});

it('refuses a PDF over the page limit, one whose text passes the size limit, and one that is not a PDF inside', async () => {
  const three = await textPdf([['one'], ['two'], ['three']]);
  expect(await pdfText('long.pdf', three, { ...limits, maxPages: 2 })).toEqual({
    refused: 'long.pdf has 3 pages; a PDF may have at most 2. Split it into smaller documents',
  });
  const wordy = await textPdf([['a'.repeat(40), 'b'.repeat(40)], ['c'.repeat(40)]]);
  expect(await pdfText('wordy.pdf', wordy, { ...limits, maxTextBytes: 100 })).toEqual({
    refused: expect.stringMatching(
      /^wordy\.pdf holds more than 100 bytes of text \(HANGAR_KB_DOCUMENT_MAX_BYTES\) by page 2 of 2: split it/,
    ),
  });
  expect(await pdfText('slow.pdf', three, { ...limits, maxMs: -1 })).toEqual({
    refused: expect.stringMatching(/^slow\.pdf took longer than 0 s to read \(stopped at page 1 of 3\)/),
  });
  const broken = Buffer.from('%PDF-1.7\nthis is not the rest of a PDF\n');
  expect(await pdfText('broken.pdf', broken, limits)).toEqual({
    refused: expect.stringMatching(/^broken\.pdf is not a PDF that can be read \(.+\): upload it again/),
  });
});

it('refuses a password-protected PDF and a scan, naming the problem and the fix', async () => {
  expect(await pdfText('secret.pdf', await passwordPdf(), limits)).toEqual({
    refused: expect.stringMatching(/^secret\.pdf is encrypted with a password, so Hangar cannot read its text: remove/),
  });
  expect(await pdfText('scan.pdf', await scannedPdf(2), limits)).toEqual({
    refused: expect.stringMatching(
      /^scan\.pdf has no text to read on any of its 2 pages: it is probably a scan \(pages of images\)\. Run OCR/,
    ),
  });
});
