import { promisify } from 'node:util';
import zlib from 'node:zlib';
import type { Plugin } from 'graphql-yoga';

export type Encoding = 'br' | 'gzip';

/** Below this an answer goes as it is: the encoding's own header and framing would eat what it saves. */
export const MIN_COMPRESSED_BYTES = 1024;

/**
 * Text worth compressing. An event stream (SSE subscriptions) is not: compressed, its events would wait in the
 * compressor's buffer instead of reaching the page as they happen; nor are multipart answers, for the same
 * reason, nor weights and images, which are compressed already.
 */
export function compressible(contentType: string | null | undefined): boolean {
  const type = (contentType ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  if (type === 'text/event-stream') return false;
  return (
    type.startsWith('text/') ||
    type === 'application/json' ||
    type === 'application/graphql-response+json' ||
    type === 'application/javascript' ||
    type === 'image/svg+xml'
  );
}

/**
 * What the client's Accept-Encoding allows, brotli first (a fifth smaller than gzip on the console's bundle);
 * null for none. q=0 refuses an encoding, and "*" stands for those not named.
 */
export function acceptedEncoding(header: string | null | undefined): Encoding | null {
  if (!header) return null;
  const weights = new Map<string, number>();
  for (const part of header.split(',')) {
    const [name = '', ...params] = part.split(';').map((s) => s.trim().toLowerCase());
    if (!name) continue;
    const q = params.map((p) => /^q=([0-9.]+)$/.exec(p)?.[1]).find((v) => v !== undefined);
    weights.set(name, q === undefined ? 1 : Number(q));
  }
  const weight = (e: string) => weights.get(e) ?? weights.get('*') ?? 0;
  const br = weight('br');
  const gzip = weight('gzip');
  if (br > 0 && br >= gzip) return 'br';
  return gzip > 0 ? 'gzip' : null;
}

const brotli = promisify(zlib.brotliCompress);
const gzip = promisify(zlib.gzip);

/**
 * In zlib's thread pool, off the event loop. 'fast' for answers made per request (brotli 4: most of the saving
 * at a tenth of the time of its best); 'best' for files compressed once and kept (brotli 11, gzip 9).
 */
export function compress(body: Buffer, encoding: Encoding, effort: 'fast' | 'best'): Promise<Buffer> {
  if (encoding === 'gzip') return gzip(body, { level: effort === 'best' ? 9 : 5 });
  return brotli(body, {
    params: {
      [zlib.constants.BROTLI_PARAM_QUALITY]: effort === 'best' ? 11 : 4,
      [zlib.constants.BROTLI_PARAM_MODE]: zlib.constants.BROTLI_MODE_TEXT,
      [zlib.constants.BROTLI_PARAM_SIZE_HINT]: body.length,
    },
  });
}

/**
 * GraphQL answers compressed when the client accepts it: the Mirror page's listing is 165 KB of JSON at 200
 * versions and 4 MB at 5000, a tenth of that compressed. Not an answer that sets a cookie (sign-in): a secret
 * compressed next to text a caller chose can be guessed from the length (BREACH), and it is small anyway.
 */
export function compressAnswers(): Plugin {
  return {
    async onResponse({ request, response, setResponse, fetchAPI }) {
      if (response.status === 204 || response.status === 304 || response.headers.has('content-encoding')) return;
      if (!compressible(response.headers.get('content-type'))) return;
      // Plain or not, the answer depends on the header: a cache in between must keep them apart.
      response.headers.append('vary', 'accept-encoding');
      const encoding = acceptedEncoding(request.headers.get('accept-encoding'));
      if (!encoding || response.headers.has('set-cookie') || request.method === 'HEAD') return;
      const body = Buffer.from(await response.arrayBuffer());
      const { status, statusText } = response;
      if (body.length < MIN_COMPRESSED_BYTES) {
        setResponse(new fetchAPI.Response(body, { status, statusText, headers: response.headers }));
        return;
      }
      const packed = await compress(body, encoding, 'fast');
      const headers = new fetchAPI.Headers(response.headers);
      headers.set('content-encoding', encoding);
      headers.set('content-length', String(packed.length));
      setResponse(new fetchAPI.Response(packed as Buffer<ArrayBuffer>, { status, statusText, headers }));
    },
  };
}
