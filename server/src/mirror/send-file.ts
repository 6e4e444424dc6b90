import fs from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '@hangar/common/log';

// Sending a verified file from the mirror's disk: Range and If-Range (RFC 9110 §14), ETag = sha256, and the
// pooled read-ahead that keeps a download at disk speed. Shared by /mirror (serve.ts) and the Hub's /hf routes.

export type ByteRange = { start: number; end: number };

/** Parses one Range header against a size: a range, 'ignore' (serve it all), or 'unsatisfiable'. */
export function parseRange(
  header: string | undefined,
  size: number,
): ByteRange | 'ignore' | 'unsatisfiable' | 'multiple' {
  if (!header) return 'ignore';
  const m = header.match(/^\s*bytes\s*=\s*(.+)$/i);
  if (!m) return 'ignore'; // another unit: RFC 9110 says to ignore what we do not understand
  const specs = (m[1] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (specs.length > 1) return 'multiple';
  const spec = specs[0] ?? '';
  const r = spec.match(/^(\d*)-(\d*)$/);
  if (!r || (r[1] === '' && r[2] === '')) return 'ignore';
  if (r[1] === '') {
    const suffix = Number(r[2]);
    if (suffix === 0 || size === 0) return 'unsatisfiable';
    return { start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(r[1]);
  const end = r[2] === '' ? size - 1 : Math.min(Number(r[2]), size - 1);
  if (r[2] !== '' && Number(r[2]) < start) return 'ignore'; // invalid: ignored, per the RFC
  if (start >= size) return 'unsatisfiable';
  return { start, end };
}

/** Bytes read ahead of the socket per download: blocks read from disk while earlier ones are being sent. */
const SEND_BLOCK = 1 << 20;
const SEND_DEPTH = 8;
/**
 * Whole blocks kept between downloads (64 MiB at most): a fresh buffer's pages are faulted in on first use, and
 * sixteen nodes starting at once would otherwise each pay for eight of them.
 */
const spare: Buffer[] = [];
const SPARE_MAX = 64;

/**
 * Bytes [start, end] of a file to the response, from a few buffers used over and over: a block is read from disk
 * while earlier ones are with the socket, and goes back to be filled again once the socket has taken it. Against
 * createReadStream piped to the response (a new buffer per read, one read at a time) this took one node from
 * 0.43× nginx to more than nginx with sendfile gets (bench/mirror.ts). Backpressure is the pool: with every block
 * with a slow socket, reading waits. A client that hangs up ends it quietly.
 */
async function sendRange(
  file: string,
  start: number,
  end: number,
  res: ServerResponse,
  onSent?: (bytes: number) => void,
) {
  const fh = await fs.open(file, 'r');
  const whole = end - start + 1 >= SEND_BLOCK;
  const size = Math.min(SEND_BLOCK, end - start + 1);
  const free: Buffer[] = [];
  let made = 0;
  let done = false;
  let wake: (() => void) | null = null;
  const resume = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  /** A block the socket is done with: filled again, or kept for the next download once this one has ended. */
  const back = (b: Buffer) => {
    if (!done) free.push(b);
    else if (whole && spare.length < SPARE_MAX) spare.push(b);
  };
  res.once('close', resume);
  try {
    for (let at = start; at <= end && !res.destroyed; ) {
      let buf = free.pop();
      if (!buf && made < SEND_DEPTH) {
        made++;
        buf = (whole && spare.pop()) || Buffer.allocUnsafeSlow(size);
      }
      if (!buf) {
        await new Promise<void>((r) => {
          wake = r;
        });
        continue;
      }
      const { bytesRead } = await fh.read(buf, 0, Math.min(size, end - at + 1), at);
      if (bytesRead === 0) throw new Error(`the file ended at ${at} bytes while being served`);
      at += bytesRead;
      const block = buf;
      res.write(bytesRead === size ? block : block.subarray(0, bytesRead), (err) => {
        if (!err) {
          onSent?.(bytesRead);
          back(block);
        }
        resume();
      });
    }
    if (!res.destroyed) res.end();
  } finally {
    done = true;
    for (const b of free.splice(0)) back(b);
    res.off('close', resume);
    await fh.close();
  }
}

/**
 * A verified file from the mirror's disk: ETag = its sha256 (so a client can check what it got against what
 * the mirror verified), one Range (RFC 9110 §14) with If-Range, If-None-Match, streamed with backpressure.
 * `headers` are added to every answer (the Hub's on /hf); `missing` answers when the file is gone from disk.
 */
export async function sendStoredFile(
  req: IncomingMessage,
  res: ServerResponse,
  o: {
    onDisk: string;
    sha256: string;
    cacheControl: string;
    headers?: Record<string, string | number>;
    missing: () => void;
    log: Logger;
    /** Told the bytes of each block the socket took (/metrics). */
    onSent?: (bytes: number) => void;
  },
) {
  const { onDisk, log } = o;
  const stat = await fs.stat(onDisk).catch(() => undefined);
  if (!stat?.isFile()) {
    log.warn('a present mirror file is missing on disk', { file: onDisk });
    return o.missing();
  }
  const size = stat.size;
  const etag = `"${o.sha256}"`;
  const headers: Record<string, string | number> = {
    'accept-ranges': 'bytes',
    etag,
    'last-modified': stat.mtime.toUTCString(),
    'content-type': 'application/octet-stream',
    'cache-control': o.cacheControl,
    'x-content-type-options': 'nosniff',
    ...o.headers,
  };
  if (req.headers['if-none-match']?.split(',').some((t) => t.trim() === etag || t.trim() === '*')) {
    res.writeHead(304, headers).end();
    return;
  }
  let range = parseRange(req.headers.range, size);
  // If-Range: the range only holds for the representation the client already has part of.
  const ifRange = req.headers['if-range'];
  if (range !== 'ignore' && ifRange && ifRange !== etag && ifRange !== headers['last-modified']) range = 'ignore';
  if (range === 'unsatisfiable' || range === 'multiple') {
    res.writeHead(416, {
      ...headers,
      'content-range': `bytes */${size}`,
      'content-type': 'text/plain; charset=utf-8',
    });
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
    await sendRange(onDisk, start, end, res, o.onSent);
  } catch (err) {
    res.destroy(); // the Content-Length promised bytes that will not come: the client must see a cut, not an end
    log.warn('serving a mirror file failed', { file: onDisk, error: err });
  }
}
