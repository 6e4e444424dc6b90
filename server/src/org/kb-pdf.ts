// A PDF's text, for a knowledge-base document, read by PDF.js (through `unpdf`, its build for servers: no worker,
// no canvas). A PDF is a program more than a text file: it may be encrypted, hold only images (a scan), run to
// thousands of pages or inflate a few megabytes into gigabytes of text. Each of these is refused, saying which and
// what to do, rather than stored half-read: the model would write pairs about whatever came out.

export type PdfLimits = {
  /** Pages read at most: a longer PDF is refused, not cut (the pairs would silently cover only its start). */
  maxPages: number;
  /** The text kept at most, in UTF-8 bytes (HANGAR_KB_DOCUMENT_MAX_BYTES: as much as a text document may hold). */
  maxTextBytes: number;
  /** How long reading may take, checked between pages. */
  maxMs: number;
};

export const PDF_LIMITS: Omit<PdfLimits, 'maxTextBytes'> = { maxPages: 2000, maxMs: 60_000 };

/** Whether the bytes are a PDF, whatever the file's name says. */
export const isPdf = (bytes: Uint8Array) =>
  bytes.length >= 5 && Buffer.from(bytes.subarray(0, 5)).toString('latin1') === '%PDF-';

type TextItem = { str?: string; hasEOL?: boolean };

/** The words of every page, a blank line between pages; or why the PDF is refused. */
export async function pdfText(
  name: string,
  bytes: Uint8Array,
  limits: PdfLimits,
): Promise<{ text: string; pages: number } | { refused: string }> {
  // Imported when a PDF arrives: PDF.js is 1.6 MB that every start would otherwise load (test/build.test.ts).
  const { getDocumentProxy } = await import('unpdf');
  const started = Date.now();
  let doc: Awaited<ReturnType<typeof getDocumentProxy>>;
  try {
    // A copy: PDF.js takes over (detaches) the buffer it is given, and the caller still hashes these bytes.
    doc = await getDocumentProxy(new Uint8Array(bytes), {
      // Font faces are not needed for text, and are where a hostile file's work would be.
      disableFontFace: true,
      stopAtErrors: false,
      verbosity: 0,
    });
  } catch (err) {
    const e = err as { name?: string; message?: string };
    if (e.name === 'PasswordException') {
      return {
        refused: `${name} is encrypted with a password, so Hangar cannot read its text: remove the password (for example \`qpdf --decrypt --password=… ${name} out.pdf\`) and upload that`,
      };
    }
    return {
      refused: `${name} is not a PDF that can be read (${e.message ?? String(err)}): upload it again, or its text as .txt`,
    };
  }
  try {
    if (doc.numPages > limits.maxPages) {
      return {
        refused: `${name} has ${doc.numPages} pages; a PDF may have at most ${limits.maxPages}. Split it into smaller documents`,
      };
    }
    const pages: string[] = [];
    let textBytes = 0;
    for (let n = 1; n <= doc.numPages; n++) {
      if (Date.now() - started > limits.maxMs) {
        return {
          refused: `${name} took longer than ${Math.round(limits.maxMs / 1000)} s to read (stopped at page ${n} of ${doc.numPages}): split it, or upload its text as .txt`,
        };
      }
      const page = await doc.getPage(n);
      const content = await page.getTextContent();
      const text = (content.items as TextItem[]).map((i) => (i.str ?? '') + (i.hasEOL ? '\n' : '')).join('');
      page.cleanup();
      textBytes += Buffer.byteLength(text);
      if (textBytes > limits.maxTextBytes) {
        return {
          refused: `${name} holds more than ${limits.maxTextBytes} bytes of text (HANGAR_KB_DOCUMENT_MAX_BYTES) by page ${n} of ${doc.numPages}: split it into smaller documents`,
        };
      }
      pages.push(text);
    }
    const text = pages.join('\n\n');
    if (!text.trim()) {
      return {
        refused: `${name} has no text to read on any of its ${doc.numPages} page${doc.numPages === 1 ? '' : 's'}: it is probably a scan (pages of images). Run OCR on it first (for example \`ocrmypdf ${name} out.pdf\`) and upload that, or upload its text as .txt`,
      };
    }
    return { text, pages: doc.numPages };
  } finally {
    await doc.loadingTask.destroy();
  }
}
