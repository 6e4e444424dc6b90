import fs from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AuditService } from '../audit/audit.service.js';
import type { AuthService } from '../auth/auth.service.js';
import type { Db } from '../db/client.js';
import type { Logger } from '../lib/log.js';
import type { MirrorService } from './mirror.service.js';
import type { MirrorPaths } from './paths.js';

// GET/HEAD /mirror/<model>/<version>/<file>: what the nodes load weights from. Only PRESENT files, whose bytes
// were verified; a single Range (RFC 9110 §14); ETag = the file's sha256, so a node can check what it got
// against what the mirror verified; streamed from disk with backpressure.

type Deps = {
  db: Db;
  paths: MirrorPaths;
  auth: AuthService;
  requireToken: boolean;
  internalToken: string;
  log: Logger;
};

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
async function sendRange(file: string, start: number, end: number, res: ServerResponse) {
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
        if (!err) back(block);
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

export function serveMirror({ db, paths, auth, requireToken, internalToken, log }: Deps) {
  return async (req: IncomingMessage, res: ServerResponse, pathname: string) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (requireToken && req.headers.authorization !== `Bearer ${internalToken}`) {
      const viewer = await auth.identify({ authorization: req.headers.authorization ?? null, method: 'GET' });
      if (viewer.kind === 'anonymous') {
        res.writeHead(401, { 'content-type': 'text/plain; charset=utf-8', 'www-authenticate': 'Bearer' });
        res.end(`${viewer.reason ?? 'the mirror needs a node or API token: Authorization: Bearer <token>'}\n`);
        return;
      }
    }
    const parts = pathname
      .replace(/^\/mirror\//, '')
      .split('/')
      .map((p) => {
        try {
          return decodeURIComponent(p);
        } catch {
          return '';
        }
      });
    const [model, version, ...rest] = parts;
    const file = rest.join('/');
    const notFound = (why: string) => {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(`${why}\n`);
    };
    if (!model || !version || !file || parts.some((p) => !p || p === '..' || p === '.'))
      return notFound('no such file in the mirror');
    const row = await db.mirrorFile.findUnique({ where: { model_version_file: { model, version, file } } });
    if (row?.state !== 'PRESENT' || !row.actualSha256) {
      return notFound(
        row ? `${model}/${version}/${file} is ${row.state.toLowerCase()}, not present` : 'no such file in the mirror',
      );
    }
    const onDisk = paths.file(model, version, file);
    const stat = await fs.stat(onDisk).catch(() => undefined);
    if (!stat?.isFile()) {
      log.warn('a present mirror file is missing on disk', { file: onDisk });
      return notFound(`${model}/${version}/${file} is listed but missing on disk`);
    }
    const size = stat.size;
    const etag = `"${row.actualSha256}"`;
    const headers: Record<string, string | number> = {
      'accept-ranges': 'bytes',
      etag,
      'last-modified': stat.mtime.toUTCString(),
      'content-type': 'application/octet-stream',
      'cache-control': 'public, max-age=300',
      'x-content-type-options': 'nosniff',
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
      await sendRange(onDisk, start, end, res);
    } catch (err) {
      res.destroy(); // the Content-Length promised bytes that will not come: the client must see a cut, not an end
      log.warn('serving a mirror file failed', { file: onDisk, error: err });
    }
  };
}

/**
 * PUT /mirror/<model>/<version>/<file>: how Hangar's own products (trained adapters) and operators' files
 * enter the mirror, verified like a fetch: an OPERATOR token, a Content-Length, and optionally the sha256 the
 * bytes must hash to (X-Content-Sha256).
 */
export function uploadToMirror({
  mirror,
  auth,
  audit,
  maxBytes,
}: {
  mirror: MirrorService;
  auth: AuthService;
  audit: AuditService;
  maxBytes: number;
}) {
  return async (req: IncomingMessage, res: ServerResponse, pathname: string) => {
    const reply = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    const viewer = await auth.identify({ authorization: req.headers.authorization ?? null, method: 'PUT' });
    if (viewer.kind !== 'user' && viewer.kind !== 'token') {
      return reply(401, {
        error:
          viewer.kind === 'anonymous' && viewer.reason
            ? viewer.reason
            : 'an upload needs an API token: Authorization: Bearer <token>',
      });
    }
    if (viewer.role === 'VIEWER')
      return reply(403, { error: 'uploading to the mirror needs the OPERATOR role; this token has VIEWER' });
    const length = Number(req.headers['content-length'] ?? Number.NaN);
    if (!Number.isSafeInteger(length)) return reply(411, { error: 'an upload needs a Content-Length header' });
    if (length > maxBytes) return reply(413, { error: `the upload is ${length} bytes; the limit is ${maxBytes}` });
    const [model = '', version = '', ...rest] = pathname
      .replace(/^\/mirror\//, '')
      .split('/')
      .map((p) => decodeURIComponent(p));
    const sha = req.headers['x-content-sha256'];
    const result = await mirror.upload(
      { viewer, requestId: crypto.randomUUID() },
      { model, version, file: rest.join('/'), size: length, sha256: typeof sha === 'string' ? sha : null },
      req,
    );
    if (!result.ok) {
      await audit.refused(
        { viewer, requestId: 'upload' },
        'uploadToMirror',
        `${model}/${version}/${rest.join('/')}`,
        result.error.message,
      );
      return reply(result.error.code === 'CONFLICT' ? 409 : 400, {
        error: result.error.message,
        code: result.error.code,
      });
    }
    const f = result.value.files.find((x) => x.file === rest.join('/'));
    return reply(201, { url: f ? mirror.fileUrl(f) : null, sha256: f?.actualSha256, size: Number(f?.bytesDone ?? 0) });
  };
}
