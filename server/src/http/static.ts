import { createReadStream, existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import path from 'node:path';
import { acceptedEncoding, compress, compressible, MIN_COMPRESSED_BYTES } from './compress.js';

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
  const packs = new PackedFiles();
  void packs.warm(root);
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
    const type = types[path.extname(file)] ?? 'application/octet-stream';
    const headers: Record<string, string | number> = {
      'content-type': type,
      'content-length': body.size,
      // Built assets carry a content hash in their name; index.html must always be re-read to find new ones.
      'cache-control': immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
    };
    const packable = compressible(type) && body.size >= MIN_COMPRESSED_BYTES && body.size <= MAX_KEPT_BYTES;
    if (packable) headers.vary = 'accept-encoding';
    const encoding = packable ? acceptedEncoding(req.headers['accept-encoding']) : null;
    const packed = encoding ? (await packs.of(file, body))?.[encoding] : undefined;
    if (encoding && packed) {
      headers['content-encoding'] = encoding;
      headers['content-length'] = packed.length;
    }
    res.writeHead(200, headers);
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    if (packed) res.end(packed);
    else createReadStream(file).pipe(res);
  };
}

/** Larger files (a source map of a big bundle) are sent as they are rather than held in memory twice more. */
const MAX_KEPT_BYTES = 16 * 1024 * 1024;

type Packed = { br: Buffer; gzip: Buffer };

/**
 * The copies the console's build wrote beside the file (web/scripts/precompress.mjs), when both are there and
 * not older than the file: a file rebuilt without them (or copied in by hand) must not be answered with the
 * bytes of the one before, so it is compressed here instead.
 */
async function precompressed(file: string, stat: { mtimeMs: number }): Promise<Packed | null> {
  const [br, gz] = await Promise.all([fs.stat(`${file}.br`), fs.stat(`${file}.gz`)]).catch(() => []);
  if (!br || !gz || br.mtimeMs < stat.mtimeMs || gz.mtimeMs < stat.mtimeMs) return null;
  const [brBytes, gzBytes] = await Promise.all([fs.readFile(`${file}.br`), fs.readFile(`${file}.gz`)]);
  return { br: brBytes, gzip: gzBytes };
}

/**
 * The console's files compressed once, at their best (brotli 11 takes a second on the main bundle, off the event
 * loop), and kept in memory: every later request is a write of bytes already made. Started for every file when
 * the server starts, so the first page load rarely waits; a file rebuilt since (another size or time) is
 * compressed again.
 */
class PackedFiles {
  private readonly kept = new Map<string, { size: number; mtimeMs: number; packed: Promise<Packed | null> }>();

  of(file: string, stat: { size: number; mtimeMs: number }): Promise<Packed | null> {
    const hit = this.kept.get(file);
    if (hit && hit.size === stat.size && hit.mtimeMs === stat.mtimeMs) return hit.packed;
    // A file that cannot be read or compressed (gone in a rebuild) is sent as the plain path would send it.
    const packed = precompressed(file, stat)
      .then(
        async (made) =>
          made ??
          fs.readFile(file).then(async (bytes) => ({
            br: await compress(bytes, 'br', 'best'),
            gzip: await compress(bytes, 'gzip', 'best'),
          })),
      )
      .catch(() => null);
    this.kept.set(file, { size: stat.size, mtimeMs: stat.mtimeMs, packed });
    return packed;
  }

  /** Compresses what a built console holds now, in the background. */
  async warm(root: string) {
    const entries = await fs.readdir(root, { recursive: true, withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      if (!e.isFile()) continue;
      const file = path.join(e.parentPath, e.name);
      if (!compressible(types[path.extname(file)])) continue;
      const stat = await fs.stat(file).catch(() => undefined);
      if (stat && stat.size >= MIN_COMPRESSED_BYTES && stat.size <= MAX_KEPT_BYTES) await this.of(file, stat);
    }
  }
}
