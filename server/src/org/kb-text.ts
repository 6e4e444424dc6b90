// What a knowledge-base upload may be, and the text Hangar keeps of it. The text is what a model is later asked
// to write questions about, so it must be text people wrote: a binary file, a file in another encoding or the
// scripts of a web page would become pairs that teach noise (or someone's hidden instructions).

import { isPdf, type PdfLimits, pdfText } from './kb-pdf.js';

export type DocumentKind = 'text/plain' | 'text/markdown' | 'text/html' | 'application/pdf';

const KINDS: Record<string, DocumentKind> = {
  txt: 'text/plain',
  text: 'text/plain',
  md: 'text/markdown',
  markdown: 'text/markdown',
  html: 'text/html',
  htm: 'text/html',
  pdf: 'application/pdf',
};

export const ACCEPTED =
  'text (.txt), Markdown (.md, .markdown) or HTML (.html, .htm) in UTF-8, or PDF (.pdf) with text';

/** The kind a document's name says it is, or why it is not accepted. */
export function kindOf(name: string): { kind: DocumentKind } | { refused: string } {
  const ext = /\.([A-Za-z0-9]+)$/.exec(name)?.[1]?.toLowerCase();
  const kind = ext ? KINDS[ext] : undefined;
  if (!kind) return { refused: `a document is ${ACCEPTED}; "${name}" is none of these (its name says which)` };
  return { kind };
}

/**
 * The text of an upload and what it really is, or why it is refused: a PDF's text layer (kb-pdf.ts), whatever its
 * name says; otherwise no NUL bytes (a binary file), valid UTF-8 (a byte-order mark is dropped), and for HTML the
 * words only, without markup, scripts or styles.
 */
export async function documentText(
  name: string,
  kind: DocumentKind,
  bytes: Uint8Array,
  pdfLimits: PdfLimits,
): Promise<{ text: string; kind: DocumentKind } | { refused: string }> {
  // By its bytes, not its name: a PDF renamed .txt is still a PDF, and its text is what to keep.
  if (isPdf(bytes)) {
    const read = await pdfText(name, bytes, pdfLimits);
    return 'refused' in read ? read : { text: normalise(read.text), kind: 'application/pdf' };
  }
  if (kind === 'application/pdf') {
    return { refused: `${name} is named as a PDF but is not one (it does not start with %PDF-): upload ${ACCEPTED}` };
  }
  const nul = bytes.indexOf(0);
  if (nul >= 0) {
    return {
      refused: `${name} holds a NUL byte (at byte ${nul}): it is a binary file, not text. Upload ${ACCEPTED}`,
    };
  }
  let decoded: string;
  try {
    decoded = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false }).decode(bytes);
  } catch {
    return {
      refused: `${name} is not valid UTF-8 (at byte ${firstInvalidUtf8(bytes)}): save it as UTF-8 (for example \`iconv -f latin1 -t utf-8\`) and upload it again`,
    };
  }
  const text = normalise(kind === 'text/html' ? await htmlToText(decoded) : decoded);
  if (!text.trim())
    return { refused: `${name} holds no text${kind === 'text/html' ? ' once its markup is removed' : ''}` };
  return { text, kind };
}

/** HTML reduced to its words: block ends become line breaks; scripts, styles and every tag and attribute go. */
export async function htmlToText(html: string): Promise<string> {
  // Imported when an HTML document arrives, not at every start (test/build.test.ts keeps the start's imports lean).
  const { default: sanitizeHtml } = await import('sanitize-html');
  const broken = html.replace(
    /<(?:br|hr)\b[^>]*>|<\/(?:p|div|h[1-6]|li|tr|pre|blockquote|section|article|header|footer|table|ul|ol|dt|dd)\s*>/gi,
    '$&\n',
  );
  const stripped = sanitizeHtml(broken, {
    allowedTags: [],
    allowedAttributes: {},
    // Their contents are code or hidden text, not what the page says.
    nonTextTags: ['script', 'style', 'textarea', 'option', 'noscript', 'template', 'iframe', 'object', 'svg', 'head'],
  });
  // sanitize-html escapes what it keeps; the text is stored as text, not as HTML.
  return (
    stripped
      .replace(/&lt;/g, '<')
      .replace(/&gt;/g, '>')
      .replace(/&quot;/g, '"')
      .replace(/&#39;/g, "'")
      .replace(/&nbsp;|\u00a0/g, ' ')
      .replace(/&amp;/g, '&')
      // A page's source indentation is not part of what it says.
      .replace(/[ \t]+/g, ' ')
      .replace(/^ /gm, '')
  );
}

function normalise(text: string): string {
  return text
    .replace(/\r\n?/g, '\n')
    .replace(/[ \t]+\n/g, '\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim();
}

/** The offset of the first byte that does not start a valid UTF-8 sequence (for the refusal). */
function firstInvalidUtf8(bytes: Uint8Array): number {
  let i = 0;
  while (i < bytes.length) {
    const b = bytes[i] as number;
    const len = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    if (len === 0 || i + len > bytes.length) return i;
    for (let k = 1; k < len; k++) if (((bytes[i + k] as number) & 0xc0) !== 0x80) return i;
    i += len;
  }
  // The decoder's finer rules (overlong forms, surrogates) caught something this scan lets through.
  return 0;
}
