import { createReadStream, existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import path from 'node:path';

const types: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.txt': 'text/plain; charset=utf-8',
  '.map': 'application/json',
};

// What a page of Hangar may do, set on every answer of the console. The built console (Vite) is one module
// script and one stylesheet from /assets, with no inline script or style (React sets style properties through
// the DOM, which a CSP allows); the favicon is a data: URL; model cards show images from the Hub and the sites
// they link. frame-ancestors and X-Frame-Options: no other site may frame the console and trick a click.
const pageHeaders = {
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

export function consoleCsp(imageSources: string[] = []): string {
  return [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    `img-src 'self' data: https: ${imageSources.join(' ')}`.trim(),
    "font-src 'self'",
    // 'self' covers the WebSocket to this origin (ws:, wss:) as well.
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join('; ');
}

/**
 * GraphiQL's page is one HTML file with its scripts, styles and workers inline (@graphql-yoga/render-graphiql),
 * so it needs 'unsafe-inline'; it still talks only to this origin and may not be framed.
 */
export const GRAPHIQL_HEADERS: Record<string, string> = {
  ...pageHeaders,
  'content-security-policy': [
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "worker-src 'self' blob: data:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; '),
};

/**
 * Serves the built console. A path without a file extension is a client-side route (/mirror, /audit?…), so it
 * gets index.html and the router takes it from there; a missing asset is a real 404, so a stale tab that asks
 * for an old bundle fails loudly instead of being handed HTML.
 */
export function serveConsole(dist: string, options: { imageSources?: string[] } = {}) {
  const root = path.resolve(dist);
  const index = path.join(root, 'index.html');
  const csp = consoleCsp(options.imageSources);
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    for (const [name, value] of Object.entries(pageHeaders)) res.setHeader(name, value);
    res.setHeader('content-security-policy', csp);
    if (!existsSync(index)) {
      res.writeHead(503, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(
        `The console is not built (no ${index}). Run "pnpm start", which builds it, or "pnpm --filter @hangar/web build".\n`,
      );
      return;
    }
    const url = new URL(req.url ?? '/', 'http://hangar');
    let file: string;
    try {
      file = path.resolve(root, `.${decodeURIComponent(url.pathname)}`);
    } catch {
      res.writeHead(400).end();
      return;
    }
    if (!file.startsWith(root + path.sep) && file !== root) {
      res.writeHead(404).end();
      return;
    }
    const stat = await fs.stat(file).catch(() => undefined);
    if (!stat?.isFile()) {
      if (path.extname(url.pathname)) {
        res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
        return;
      }
      file = index;
    }
    const immutable = file.includes(`${path.sep}assets${path.sep}`);
    const body = await fs.stat(file);
    res.writeHead(200, {
      'content-type': types[path.extname(file)] ?? 'application/octet-stream',
      'content-length': body.size,
      // Built assets carry a content hash in their name; index.html must always be re-read to find new ones.
      'cache-control': immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
    });
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    createReadStream(file).pipe(res);
  };
}
