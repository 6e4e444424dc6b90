// The markdown renderer and the sanitizer are imported at the first card, not at the server's start: a fifth of
// a second of every start (bench/start.ts), for what only the registry explorer's repository page shows.
const importRenderers = () => Promise.all([import('marked'), import('sanitize-html')]);
let renderers: ReturnType<typeof importRenderers> | undefined;

/**
 * A model card as safe HTML: markdown rendered, then everything but plain formatting removed (no scripts, no
 * styles, no event handlers), with relative links pointed at the repository on the registry's site.
 *
 * Images are dropped for their alt text: a card must render where the browser cannot reach the Hub (the server
 * may reach it through a proxy the operators' desks cannot), and a page that waits on, or leaks a request to,
 * someone else's server to show a badge is worse than one that says what the badge was.
 */
export async function renderCard(markdown: string, repoUrl: string, revision: string): Promise<string> {
  renderers ??= importRenderers();
  const [{ marked }, { default: sanitizeHtml }] = await renderers;
  // The YAML front matter is metadata for machines, not card text.
  const body = markdown.replace(/^---\n[\s\S]*?\n---\n/, '');
  const html = marked.parse(body, { async: false, gfm: true }) as string;
  const absolute = (src: string, kind: 'blob' | 'resolve') => {
    if (/^([a-z][a-z0-9+.-]*:|#|\/\/)/i.test(src)) return src;
    const path = src.replace(/^\.?\//, '');
    return `${repoUrl}/${kind}/${encodeURIComponent(revision)}/${path}`;
  };
  return sanitizeHtml(html, {
    // No img: each becomes a span of its alt text (transformTags) before the allow-list is applied.
    allowedTags: sanitizeHtml.defaults.allowedTags.concat(['h1', 'h2', 'details', 'summary']),
    allowedAttributes: {
      a: ['href', 'title', 'rel', 'target'],
      span: ['class', 'title'],
      code: ['class'],
      th: ['align'],
      td: ['align'],
    },
    allowedSchemes: ['http', 'https', 'mailto'],
    transformTags: {
      a: (tag, attribs) => ({
        tagName: tag,
        attribs: {
          ...attribs,
          href: absolute(attribs.href ?? '', 'blob'),
          rel: 'noopener noreferrer',
          target: '_blank',
        },
      }),
      img: (_tag, attribs) => ({
        tagName: 'span',
        attribs: { class: 'card-image', title: 'an image, not loaded: the console loads nothing from other servers' },
        text: `[image${attribs.alt?.trim() ? `: ${attribs.alt.trim()}` : ''}]`,
      }),
    },
  });
}
