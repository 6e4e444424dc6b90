import fs from 'node:fs/promises';
import path from 'node:path';
import { type GetResponse, type HttpGetError, httpGet } from '../lib/download/http-get.js';
import { receiveInto, watchStall } from '../lib/download/receive.js';
import { Sha256 } from '../lib/download/sha256.js';
import type { OutboundGuard } from '../lib/outbound.js';

// One file from an upstream to a partial path, hashed as it arrives, resumed with Range after anything that
// interrupts it. The rules, each from a way downloads go wrong in practice:
// - a 200 to a Range request means the server ignored it: start over from zero rather than append the whole
//   file after the part we have;
// - a 416, or an upstream whose ETag changed (If-Range), starts over once, never in a loop;
// - an HTML page or an empty body is never taken for the file;
// - a stall (no bytes for a while) counts as an error and resumes like a dropped connection;
// - a full disk stops at once with a clear message and keeps the partial, so a retry continues from it;
// - an attempt that moved bytes starts the count of failed attempts again: a long file on a flaky link fails
//   only when tries in a row bring nothing;
// - an upstream that cannot be reached (refused or reset connections, timeouts, 5xx, 429) is tried again with a
//   capped backoff, honouring Retry-After, until it has been out of reach for giveUpAfterMs (hours by default):
//   an outage of a minute must not fail a download left to run overnight;
// - an answer that will not change by asking again (400, 401, 403, 404, 410) fails at once with its reason.

export type Progress = { bytesDone: number; bytesTotal: number | null; etag: string | null };

/** A transfer waiting to try again: the try that comes next, when, and what went wrong with the last. */
export type RetryState = { attempt: number; nextAt: Date; reason: string };

export type TransferOptions = {
  url: string;
  partialPath: string;
  expectedSize?: number | null;
  /** The validator from an earlier attempt (persisted), sent as If-Range so a changed file is not stitched. */
  etag?: string | null;
  headers?: Record<string, string>;
  stallMs: number;
  /** Failed attempts in a row that moved no bytes, other than an unreachable upstream, before giving up. */
  maxAttempts: number;
  /** How long the upstream may stay out of reach (no byte arriving) before giving up. */
  giveUpAfterMs?: number;
  /** The backoff's cap between tries at an unreachable upstream; a Retry-After may ask for longer. */
  retryMaxMs?: number;
  /** Told when the transfer waits to try again, and with null once bytes move again. */
  onRetry?: (retry: RetryState | null) => void;
  /** A bandwidth limit that every byte written takes from (bandwidth.ts). */
  throttle?: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
  /**
   * Asked once the upstream has published the file's sha256 and before any byte of it is written: true when the
   * mirror already holds a verified file with those bytes, which it links instead of downloading them again.
   */
  alreadyHeld?: (sha256: string, size: number | null) => Promise<boolean>;
  /** Flush the file to the disk before calling it whole (HANGAR_MIRROR_FSYNC). */
  fsync?: boolean;
  signal: AbortSignal;
  /** Called as bytes arrive; the caller decides how often to persist. */
  onProgress: (p: Progress) => void;
  /**
   * Asked for room for the bytes still to come, once their number is known and before any is written: null
   * when they are reserved, or why there is no room (the disk's free space less what other running downloads
   * still need). Then the file fails at once, rather than filling the disk with bytes that cannot all fit.
   */
  reserveSpace: (bytes: number) => Promise<string | null>;
  /** Checks each hop's host and address (the server's own fetches: HANGAR_FETCH_ALLOW). */
  guard?: OutboundGuard;
  backoffMs?: (attempt: number) => number;
  log?: (msg: string, fields: Record<string, unknown>) => void;
};

export type TransferDone = {
  ok: true;
  size: number;
  sha256: string;
  /** The sha256 the upstream published (X-Linked-Etag / ETag), when it looks like one. */
  upstreamSha256: string | null;
  etag: string | null;
  /** The mirror already held these bytes (alreadyHeld): nothing was written, the caller links them. */
  held?: boolean;
};
export type TransferFailed = { ok: false; reason: string; keepPartial: boolean };

class Retryable extends Error {}
/** The upstream is out of reach, or says it is overloaded: retried until the deadline, not counted. */
class Unreachable extends Retryable {
  constructor(
    message: string,
    readonly retryAfterMs: number | null = null,
  ) {
    super(message);
  }
}

/** Socket errors that say the upstream (or the way to it) is down, rather than that the request is wrong. */
const OUT_OF_REACH = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/** Retry-After as seconds or an HTTP date, in milliseconds from now; null when absent or unreadable. */
export function retryAfterMs(value: string | null, now = Date.now()): number | null {
  if (!value) return null;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}
class Fatal extends Error {
  constructor(
    message: string,
    readonly keepPartial = false,
  ) {
    super(message);
  }
}

const SHA256 = /^[0-9a-f]{64}$/;
const unquote = (v: string | null) => v?.replace(/^W\//, '').replace(/^"|"$/g, '') ?? null;

export function upstreamDigest(headers: Headers): string | null {
  for (const name of ['x-linked-etag', 'etag']) {
    const v = unquote(headers.get(name))?.toLowerCase() ?? null;
    if (v && SHA256.test(v)) return v;
  }
  return null;
}

export async function transfer(o: TransferOptions): Promise<TransferDone | TransferFailed> {
  await fs.mkdir(path.dirname(o.partialPath), { recursive: true });
  const hash = new Sha256();
  try {
    return await attempts(o, hash);
  } finally {
    await hash.close().catch(() => {});
  }
}

async function attempts(o: TransferOptions, hash: Sha256): Promise<TransferDone | TransferFailed> {
  // After a restart the hash state is gone: re-reading the partial picks it up exactly where the bytes stop.
  let offset = await hash.addFile(o.partialPath);
  let etag = o.etag ?? null;
  let startedOver = false;
  let upstreamSha256: string | null = null;
  let lastError = 'no attempt was made';
  const cap = o.retryMaxMs ?? 60_000;
  const giveUpAfter = o.giveUpAfterMs ?? 6 * 3_600_000;
  const backoff = o.backoffMs ?? ((n) => Math.min(cap, 500 * 2 ** (n - 1)));
  // Counted from the last byte that arrived: `tries` numbers the attempts since (the backoff and the console's
  // "attempt 3"), `misses` those of them that were not an outage (what maxAttempts bounds).
  let tries = 0;
  let misses = 0;
  let quietSince = Date.now();
  let waiting = false;

  // Opened before each request and appended to: the body must be read the moment it arrives, because a
  // connection that drops while bytes sit unread in the stream's buffer takes those bytes with it.
  let fh: fs.FileHandle | undefined;
  const startOver = async (why: string) => {
    if (startedOver) throw new Fatal(`${why} again after starting over once: giving up rather than looping`);
    startedOver = true;
    o.log?.('starting the file over', { url: o.url, why });
    await fh?.truncate(0);
    await hash.reset();
    offset = 0;
  };

  for (;;) {
    if (o.signal.aborted) return { ok: false, reason: 'cancelled', keepPartial: false };
    tries++;
    const before = offset;
    const stall = new AbortController();
    let total: number | null = null;
    let response: GetResponse | undefined;
    const watch = watchStall(o.stallMs, stall, () => new Retryable(`stalled: no bytes for ${o.stallMs / 1000} s`));
    try {
      await fh?.close(); // left open by a `continue` (416, a wrong range) that starts the next request
      fh = await fs.open(o.partialPath, 'a');
      const headers: Record<string, string> = { ...o.headers, 'accept-encoding': 'identity' };
      if (offset > 0) {
        headers.range = `bytes=${offset}-`;
        // Only a strong validator may guard a byte range (RFC 9110 §13.1.5).
        if (etag && !etag.startsWith('W/')) headers['if-range'] = etag;
      }
      const res = await httpGet(o.url, {
        headers,
        signal: AbortSignal.any([o.signal, stall.signal]),
        guard: o.guard,
      }).catch((err: HttpGetError) => {
        // A host the policy refuses stays refused: retrying would only ask again.
        if (err.code === 'EOUTBOUND') throw new Fatal(`refused: ${err.message}`);
        throw OUT_OF_REACH.has(err.code ?? '') ? new Unreachable(err.message) : err;
      });
      response = res;
      const status = res.status;
      // The Hub says why in X-Error-Message ("Entry not found", "Access to model … is restricted").
      const why = res.headers.get('x-error-message');
      const said = why ? `: ${why.slice(0, 200)}` : '';
      if (status === 404 || status === 410) throw new Fatal(`the upstream has no such file (HTTP ${status}${said})`);
      if (status === 401 || status === 403) {
        throw new Fatal(
          `the upstream refused access (HTTP ${status}${said}): a gated repository needs HANGAR_HUB_TOKEN`,
        );
      }
      if (status === 400) throw new Fatal(`the upstream refused the request (HTTP 400${said})`);
      if (status === 416) {
        res.cancel();
        await startOver('the upstream refused the byte range (HTTP 416)');
        continue;
      }
      if (status === 429 || status === 408 || status >= 500) {
        res.cancel();
        throw new Unreachable(
          `the upstream answered HTTP ${status}${status === 429 ? ' (too many requests)' : ''}`,
          retryAfterMs(res.headers.get('retry-after')),
        );
      }
      if (status !== 200 && status !== 206) throw new Fatal(`the upstream answered HTTP ${status}`);
      if ((res.headers.get('content-type') ?? '').includes('text/html')) {
        throw new Retryable('the upstream answered with an HTML page, not the file');
      }
      const newEtag = res.headers.get('etag');
      upstreamSha256 = upstreamDigest(res.headers) ?? upstreamSha256;

      if (status === 206) {
        const m = res.headers.get('content-range')?.match(/^bytes (\d+)-(\d+)\/(\d+|\*)$/);
        if (!m || Number(m[1]) !== offset) {
          res.cancel();
          await startOver(`the upstream answered a different range (${res.headers.get('content-range') ?? 'none'})`);
          continue;
        }
        total = m[3] === '*' ? null : Number(m[3]);
      } else {
        if (offset > 0) {
          // A 200 to a Range request: the server ignored the range, or If-Range found the file changed.
          const changed = etag && newEtag && unquote(etag) !== unquote(newEtag);
          await startOver(
            changed ? 'the upstream file changed (new ETag)' : 'the upstream ignored the byte range (HTTP 200)',
          );
        }
        const length = res.headers.get('content-length');
        total = length === null ? null : Number(length);
      }
      etag = newEtag ?? etag;
      if (o.expectedSize != null && total !== null && total !== o.expectedSize) {
        throw new Fatal(`the upstream says the file is ${total} bytes; ${o.expectedSize} were expected`);
      }
      if (total === 0) throw new Retryable('the upstream sent an empty body');
      if (o.alreadyHeld && upstreamSha256 && (await o.alreadyHeld(upstreamSha256, total))) {
        res.cancel();
        await fh.truncate(0);
        await fh.close();
        fh = undefined;
        return { ok: true, size: total ?? 0, sha256: upstreamSha256, upstreamSha256, etag, held: true };
      }
      if (total !== null) {
        const noRoom = await o.reserveSpace(total - offset);
        if (noRoom) throw new Fatal(noRoom, true);
      }
      o.onProgress({ bytesDone: offset, bytesTotal: total, etag });

      const at = { offset };
      try {
        await receiveInto(res, fh, hash, at, {
          check: (handed) => {
            if (o.expectedSize != null && handed > o.expectedSize)
              throw new Fatal(`the upstream sent more than the ${o.expectedSize} bytes the file has`);
          },
          onBytes: watch.heard,
          throttle: o.throttle && {
            slice: () => o.throttle?.slice() ?? null,
            take: async (n) => {
              await o.throttle?.take(n, o.signal);
              watch.heard(n); // waiting on the limit is not a stalled upstream
            },
          },
          onWritten: (bytesDone) => {
            if (waiting) {
              waiting = false;
              o.onRetry?.(null);
            }
            o.onProgress({ bytesDone, bytesTotal: total, etag });
          },
          // With fsync, on the disk before it is called whole: the mirror puts it in place next, and a crash of
          // the machine after that must not leave a listed file whose last bytes were only ever in memory.
          fsync: o.fsync,
        });
      } finally {
        offset = at.offset; // what the partial holds, whatever happened
      }
      if (total !== null && offset < total) throw new Retryable(`the connection ended at ${offset} of ${total} bytes`);
      if (offset === 0) throw new Retryable('the upstream sent an empty body');
      await fh.close();
      fh = undefined;
      return { ok: true, size: offset, sha256: await hash.digest(), upstreamSha256, etag };
    } catch (caught) {
      await fh?.close().catch(() => {});
      fh = undefined;
      const err = stall.signal.aborted && !o.signal.aborted ? stall.signal.reason : caught;
      stall.abort();
      response?.cancel(); // a body left half-read would hold its socket open
      if (o.signal.aborted) return { ok: false, reason: 'cancelled', keepPartial: false };
      if ((err as NodeJS.ErrnoException)?.code === 'ENOSPC') {
        return {
          ok: false,
          reason: `the disk is full after ${offset} bytes: the partial is kept; free space and retry`,
          keepPartial: true,
        };
      }
      if (err instanceof Fatal) return { ok: false, reason: err.message, keepPartial: err.keepPartial };
      // Whatever was written before the error is good: the hash and offset only move with bytes on disk. But a
      // write that failed half-way leaves the file longer than the offset, so cut it back to what was hashed.
      await fs.truncate(o.partialPath, offset).catch(() => {});
      lastError = describe(err, offset, total);
      // A stall with nothing received is a timeout: the upstream is not answering.
      const stalled = stall.signal.aborted && err === stall.signal.reason && offset === before;
      const outage =
        err instanceof Unreachable || stalled || OUT_OF_REACH.has((err as NodeJS.ErrnoException)?.code ?? '');
      if (offset > before) {
        // Bytes moved: whatever went wrong, the upstream is there and the file is getting closer.
        tries = 1;
        misses = 0;
        quietSince = Date.now();
      } else if (!outage) misses++;
      const quiet = Date.now() - quietSince;
      o.log?.('transfer interrupted; will resume', { url: o.url, attempt: tries, at: offset, error: lastError });
      if (!outage && misses >= o.maxAttempts) {
        return {
          ok: false,
          reason: `gave up after ${misses} attempts; the last: ${lastError}`,
          keepPartial: true,
        };
      }
      if (outage && quiet >= giveUpAfter) {
        return {
          ok: false,
          reason: `gave up: no byte arrived for ${formatDuration(quiet)} (HANGAR_MIRROR_GIVE_UP_AFTER); the last: ${lastError}; retry continues from the partial`,
          keepPartial: true,
        };
      }
      // Retry-After is honoured even past the cap (the upstream knows its own outage), but never past the deadline:
      // then one last try is made when it falls due.
      const asked = err instanceof Unreachable ? err.retryAfterMs : null;
      const wait = Math.max(0, Math.min(Math.max(backoff(tries), asked ?? 0), giveUpAfter - quiet));
      waiting = true;
      o.onRetry?.({ attempt: tries + 1, nextAt: new Date(Date.now() + wait), reason: lastError });
      await sleep(wait, o.signal);
    } finally {
      watch.stop();
    }
  }
}

/** "90 s", "12 min", "6 h": how long, as the log and the console say it. */
export function formatDuration(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 360) / 10} h`;
}

/** Words for what went wrong on the wire: where a cut left the file, rather than a bare error code. */
function describe(err: unknown, offset: number, total: number | null): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'EPREMATURE' || code === 'ECONNRESET' || code === 'EPIPE') {
    const at = `${offset}${total === null ? '' : ` of ${total}`}`;
    return `the connection was cut at ${at} bytes${code === 'EPREMATURE' ? '' : ` (${code})`}`;
  }
  return err.message;
}

function sleep(ms: number, signal: AbortSignal) {
  return new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    });
  });
}
