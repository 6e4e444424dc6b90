import type { IncomingMessage, ServerResponse } from 'node:http';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Logger } from '@hangar/common/log';
import { parseRange } from '../send-file.js';
import type { MirrorStore } from './store.js';

// A verified blob from a mirror store to an HTTP answer, with the same rules as a file from the disk
// (send-file.ts): ETag = sha256, one Range with If-Range, If-None-Match, 416 past the end. On a bucket the range
// is asked of the store itself (GetObject with Range), so serving a shard's header reads kilobytes, not the file.
// With `presign`, a store that can hand out a short-lived URL answers 302 to it instead, and the client fetches
// the bytes from the store (it checks them against the sha256 all the same); the caller applies the owners'
// rules before calling this, as before any file is sent.

export async function sendStoreBlob(
  req: IncomingMessage,
  res: ServerResponse,
  o: {
    store: MirrorStore;
    sha256: string;
    /** The file's name, for the presigned URL's Content-Disposition. */
    fileName?: string;
    cacheControl: string;
    headers?: Record<string, string | number>;
    /** Seconds a presigned URL holds (HANGAR_S3_PRESIGN); none, and the bytes are streamed. */
    presignSeconds?: number | null;
    missing: () => void;
    log: Logger;
    onSent?: (bytes: number) => void;
  },
) {
  const { store, sha256, log } = o;
  const stat = await store.stat(sha256).catch((err) => {
    log.warn('the mirror store could not be asked for a file', { store: store.where, sha256, error: err });
    return null;
  });
  if (!stat) {
    log.warn('a present mirror file is missing from its store', { store: store.where, sha256 });
    return o.missing();
  }
  const size = stat.size;
  const etag = `"${sha256}"`;
  const headers: Record<string, string | number> = {
    'accept-ranges': 'bytes',
    etag,
    'content-type': 'application/octet-stream',
    'cache-control': o.cacheControl,
    'x-content-type-options': 'nosniff',
    ...o.headers,
  };
  if (req.headers['if-none-match']?.split(',').some((t) => t.trim() === etag || t.trim() === '*')) {
    res.writeHead(304, headers).end();
    return;
  }
  if (o.presignSeconds && req.method === 'GET') {
    const url = await store.presign(sha256, { seconds: o.presignSeconds, fileName: o.fileName });
    if (url) {
      // Never cached: the URL stops working after presignSeconds, and is this caller's alone.
      res.writeHead(302, { ...headers, location: url, 'cache-control': 'private, no-store', 'content-length': 0 });
      res.end();
      return;
    }
  }
  let range = parseRange(req.headers.range, size);
  const ifRange = req.headers['if-range'];
  if (range !== 'ignore' && ifRange && ifRange !== etag) range = 'ignore';
  if (range === 'unsatisfiable' || range === 'multiple') {
    res.writeHead(416, { ...headers, 'content-range': `bytes */${size}`, 'content-type': 'text/plain; charset=utf-8' });
    res.end(range === 'multiple' ? 'one byte range per request\n' : `the file is ${size} bytes\n`);
    return;
  }
  const { start, end } = range === 'ignore' ? { start: 0, end: size - 1 } : range;
  const length = size === 0 ? 0 : end - start + 1;
  if (range === 'ignore') res.writeHead(200, { ...headers, 'content-length': length });
  else res.writeHead(206, { ...headers, 'content-length': length, 'content-range': `bytes ${start}-${end}/${size}` });
  if (req.method === 'HEAD' || length === 0) {
    res.end();
    return;
  }
  try {
    const body = await store.read(sha256, range === 'ignore' ? undefined : { start, end });
    const count = new Transform({
      transform(chunk: Buffer, _enc, done) {
        o.onSent?.(chunk.length);
        done(null, chunk);
      },
    });
    await pipeline(body, count, res);
  } catch (err) {
    res.destroy(); // the Content-Length promised bytes that will not come: the client must see a cut, not an end
    if ((err as NodeJS.ErrnoException).code !== 'ERR_STREAM_PREMATURE_CLOSE')
      log.warn('serving a mirror file from its store failed', { store: store.where, sha256, error: err });
  }
}
