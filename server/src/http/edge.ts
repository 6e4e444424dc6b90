import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '@hangar/common/log';
import { sendJson } from './reply.js';

// What the HTTP edge checks before any route runs: a body that arrives too slowly, a NUL in the URL, and
// whether the server is ready. Kept apart from app.ts so each rule can be read (and extended) on its own.

export type BodyLimits = { bodyTimeoutMs: number; uploadMinBytesPerSecond: number; uploadRateWindowMs: number };

/**
 * Uploads (weights, pairs, adapters) may legitimately take hours on a slow link, so they get a minimum rate
 * rather than a deadline; every other body is small (GraphQL's is capped by HANGAR_MAX_BODY_BYTES) and gets a
 * deadline. Either way a client trickling a byte every few seconds no longer holds a connection for ever.
 */
export function isUpload(method: string | undefined, path: string): boolean {
  if (method === 'PUT' && path.startsWith('/mirror/')) return true;
  return (method === 'POST' || method === 'PUT') && path.startsWith('/api/train/');
}

export function guardBody(
  req: IncomingMessage,
  res: ServerResponse,
  upload: boolean,
  limits: BodyLimits,
  log: Logger,
  path: string,
) {
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  if (!hasBody || req.complete) return;
  const cut = (why: string) => {
    log.warn('cut off a request whose body came too slowly', { path, remote: req.socket.remoteAddress, why });
    const socket = req.socket;
    // Answer when nothing was answered yet, then close: the connection is not reused for anything.
    if (!res.headersSent) {
      res.once('finish', () => socket.destroy());
      sendJson(res, 408, { error: why, code: 'BODY_TOO_SLOW' }, { headers: { connection: 'close' } });
    }
    setTimeout(() => socket.destroy(), 1000).unref();
  };
  let timer: NodeJS.Timeout;
  if (!upload) {
    timer = setTimeout(() => {
      if (!req.complete) {
        cut(`the request body did not arrive within ${limits.bodyTimeoutMs} ms (HANGAR_BODY_TIMEOUT_MS)`);
      }
    }, limits.bodyTimeoutMs);
  } else {
    const window = limits.uploadRateWindowMs;
    const least = Math.ceil((limits.uploadMinBytesPerSecond * window) / 1000);
    let last = req.socket.bytesRead;
    timer = setInterval(() => {
      if (req.complete) return clearInterval(timer);
      const read = req.socket.bytesRead;
      // Bytes waiting to be read mean Hangar (its disk, its hashing) is the slow side, not the client.
      const serverBehind = req.readableLength > 0;
      if (!serverBehind && read - last < least) {
        cut(
          `the upload sent ${read - last} bytes in ${window} ms; at least ${limits.uploadMinBytesPerSecond} bytes per second are needed (HANGAR_UPLOAD_MIN_BYTES_PER_SECOND)`,
        );
        return clearInterval(timer);
      }
      last = read;
    }, window);
  }
  timer.unref();
  // On the request, not the response: a route may answer (413, 405) before the body is in, and a body still
  // trickling in after the answer holds the connection all the same.
  req.once('close', () => clearTimeout(timer));
}

// Paths that belong to APIs and never to the console: a script that asks for a wrong one must get a 404 it can
// read, not the console's page with 200, which a client would take as an answer and fail to parse.
// `/mirror` alone is the console's Mirror page; the mirror's files are under `/mirror/`.
const API_PREFIXES = ['/api', '/v1', '/hf', '/graphql'];

/** Whether a path lies under one of the APIs' prefixes (the prefix itself included), so it is never the console's. */
export function isApiPath(path: string): boolean {
  return path.startsWith('/mirror/') || API_PREFIXES.some((p) => path === p || path.startsWith(`${p}/`));
}

/** A NUL (%00) in a URL: PostgreSQL cannot store it and no name in Hangar holds one. */
export function urlHasNul(url: string): boolean {
  return /%00/.test(url) || url.includes('\u0000');
}

/**
 * Readiness is a list of checks; each answers why the server is not ready (for anyone who asks: no host names,
 * ports or driver messages, which go to the log), or undefined when its part is fine.
 */
export type ReadinessCheck = () => Promise<string | undefined> | string | undefined;

export async function readiness(checks: ReadinessCheck[]): Promise<{ ready: true } | { ready: false; reason: string }> {
  const reasons: string[] = [];
  for (const check of checks) {
    const reason = await check();
    if (reason) reasons.push(reason);
  }
  return reasons.length ? { ready: false, reason: reasons.join('; ') } : { ready: true };
}

/** Runs a check with a deadline, so a database that does not answer makes /readyz say so instead of hanging. */
export function withDeadline<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer within ${ms} ms`)), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
