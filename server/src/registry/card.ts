import { marked } from 'marked';
import sanitizeHtml from 'sanitize-html';

/**
 * A model card as safe HTML: markdown rendered, then everything but plain formatting removed (no scripts, no
 * styles, no event handlers), with relative links and images pointed at the repository on the registry's site.
 */
export function renderCard(markdown: string, repoUrl: string, revision: string): string {
  // The YAML front matter is metadata for machines, not card text.
  const body = markdown.replace(/^---\n[\s\S]*?\n---\n/, '');
  const html = marked.parse(body, { async: false, gfm: true }) as string;
  const absolute = (src: string, kind: 'blob' | 'resolve') => {
    if (/^([a-z][a-z0-9+.-]*:|#|\/\/)/i.test(src)) return src;
    const path = src.replace(/^\.?\//, '');
    return `${repoUrl}/${kind}/${encodeURIComponent(revision)}/${path}`;
  };
  return sanitizeHtml(html, {
    allowedTags: sanitizeHtml.defaults.allowedTags.concat(['img', 'h1', 'h2', 'details', 'summary']),
    allowedAttributes: {
      a: ['href', 'title', 'rel', 'target'],
      img: ['src', 'alt', 'title', 'width', 'height'],
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
      img: (tag, attribs) => ({ tagName: tag, attribs: { ...attribs, src: absolute(attribs.src ?? '', 'resolve') } }),
    },
  });
}
