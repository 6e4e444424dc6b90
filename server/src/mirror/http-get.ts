import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';

// A GET for the mirror's downloads on Node's own http client rather than fetch(): fetch hands the body over as a
// web stream, and on a fast link that layer alone held a download to 0.39× `curl -o` (bench/mirror.ts); Node's
// streams give the socket's chunks as they come. What fetch did for us is done here: redirects (the Hub sends
// every file to its CDN), with the credentials dropped when a redirect leaves the origin.

export type GetResponse = {
  status: number;
  headers: Headers;
  /** The body as it arrives; read it at once or cancel it. */
  body: IncomingMessage;
  /** Drops the body and its connection. */
  cancel(): void;
};

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 10;
/** Headers that carry credentials: never sent to another origin a redirect points at. */
const PRIVATE = ['authorization', 'cookie', 'proxy-authorization'];

export class HttpGetError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}

export async function httpGet(
  url: string,
  o: { headers: Record<string, string>; signal: AbortSignal },
): Promise<GetResponse> {
  let current = new URL(url);
  let headers = { ...o.headers };
  for (let hop = 0; hop <= MAX_REDIRECTS; hop++) {
    const res = await request(current, headers, o.signal);
    const location = res.headers.location;
    if (REDIRECTS.has(res.statusCode ?? 0) && location) {
      res.resume();
      res.destroy();
      const next = new URL(location, current);
      if (next.protocol !== 'http:' && next.protocol !== 'https:')
        throw new HttpGetError(`the upstream redirected to a ${next.protocol} URL`);
      if (next.origin !== current.origin)
        headers = Object.fromEntries(Object.entries(headers).filter(([k]) => !PRIVATE.includes(k.toLowerCase())));
      current = next;
      continue;
    }
    const h = new Headers();
    for (const [k, v] of Object.entries(res.headers)) {
      if (v === undefined) continue;
      for (const one of Array.isArray(v) ? v : [v]) h.append(k, one);
    }
    return { status: res.statusCode ?? 0, headers: h, body: res, cancel: () => res.destroy() };
  }
  throw new HttpGetError(`the upstream redirected more than ${MAX_REDIRECTS} times`);
}

function request(url: URL, headers: Record<string, string>, signal: AbortSignal): Promise<IncomingMessage> {
  const client = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = client.get(url, { headers, signal }, resolve);
    req.on('error', (err: NodeJS.ErrnoException) => {
      reject(
        signal.aborted
          ? signal.reason
          : new HttpGetError(`could not reach the upstream (${err.code ?? err.message})`, err.code),
      );
    });
  });
}
