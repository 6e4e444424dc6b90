import fs from 'node:fs/promises';
import path from 'node:path';
import type { OutboundGuard } from '../outbound.js';
import { backoffMs, retryAfterMs, sleep } from '../retry.js';
import { type GetResponse, type HttpGetError, httpGet } from './http-get.js';
import { bodyText, receiveInto, watchStall } from './receive.js';
import { Sha256 } from './sha256.js';
import { type DownloadSink, receiveIntoSink } from './sink.js';

// One file from an upstream to a partial path, hashed as it arrives, resumed with Range after anything that
// interrupts it: the one download loop behind the mirror's fetches (mirror/transfer.ts), a node's model cache and
// a training job's data and weights (agent/). Each caller sets the rules as options; the rules themselves, each
// from a way downloads go wrong in practice:
// - a 200 to a Range request means the server ignored it (or If-Range found the file changed): start over from
//   zero rather than append the whole file after the part we have;
// - a 416 whose Content-Range says the file is exactly as long as the part means the part is whole: verify it;
//   any other 416, a range other than the one asked for, or a resumed file that fails verification starts over
//   once, never in a loop;
// - a stall (no bytes for stallMs) counts as an error and resumes like a dropped connection;
// - a full disk stops at once with a clear message and keeps the partial, so a retry continues from it;
// - a try that moved bytes starts the count of failed tries again: a long file on a flaky link fails only when
//   tries in a row bring nothing;
// - with `giveUpAfterMs`, an upstream that cannot be reached (refused or reset connections, timeouts, 5xx, 429,
//   a stall before any byte) is tried again with the backoff, honouring Retry-After, until it has been out of
//   reach that long, without counting against maxAttempts: an outage of a minute must not fail a download left
//   to run overnight. Without it, such a try counts like any other;
// - an answer that will not change by asking again (a 4xx other than 408 and 429) fails at once with its reason;
// - the file is verified (size, sha256: given, or the one the upstream publishes) before it is called whole, and
//   a file that does not verify is removed, never handed over.
//
// Over 400 lines on purpose: one loop whose state (the offset, the running hash, the open partial, the counts of
// tries) every rule above reads and moves together; spread over files, each rule would need all of it passed in.

export type Progress = {
  bytesDone: number;
  bytesTotal: number | null;
  etag: string | null;
  /** The sha256 the upstream publishes for the file (X-Linked-Etag / ETag), once it has answered. */
  upstreamSha256: string | null;
};

/** A download waiting to try again: the try that comes next, when, and what went wrong with the last. */
export type RetryState = { attempt: number; nextAt: Date; reason: string };

export type AttemptPolicy = {
  /** Failed tries in a row that moved no bytes (outages aside, with giveUpAfterMs) before giving up. */
  maxAttempts: number;
  /** How long the upstream may stay out of reach (no byte arriving) before giving up; unset: outages count. */
  giveUpAfterMs?: number | null;
  /** The wait before retry n (1, 2, …): 500 ms doubling up to 60 s unless given. A Retry-After may ask for longer. */
  backoffMs?: (n: number) => number;
};

/** What the upstream answered, before any byte of the body is written. */
export type Head = {
  status: number;
  headers: Headers;
  /** Bytes the whole file has, when the upstream says. */
  total: number | null;
  /** Bytes already in the partial that this answer continues. */
  offset: number;
  upstreamSha256: string | null;
  partialPath: string;
};

export type ResumableOptions = {
  url: string;
  /**
   * Where the bytes gather (unless `sink` is given). A function names it by the sha256 the upstream publishes (a cache by content): it is
   * known from the first answer on, a part left there by an earlier run is resumed, and when a later answer
   * publishes another sha256 (the file changed), the old part is removed and the new one started.
   */
  partialPath?: string | ((upstreamSha256: string) => string);
  /**
   * Instead of the partial file: the caller's own resumable write (sink.ts, the mirror's bucket), which holds and
   * hashes the bytes; then `partialPath` is not used and `fsync` is the sink's business.
   */
  sink?: DownloadSink;
  headers?: Record<string, string>;
  /** The validator from an earlier attempt (persisted), sent as If-Range so a changed file is not stitched. */
  etag?: string | null;
  attempts: AttemptPolicy;
  /** Without a byte for this long, a try counts as stalled and the download resumes. */
  stallMs: number;
  /**
   * What the file must be. `sha256: 'upstream'` checks it against the sha256 the upstream publishes, and fails
   * at once when it publishes none.
   */
  expect?: { size?: number | null; sha256?: string | null | 'upstream' };
  /** An HTML page (an error page a proxy or CDN answered 200 with) is never taken for the file. */
  refuseHtml?: boolean;
  /** An empty body is never taken for the file (a file the mirror fetches is never empty). */
  refuseEmpty?: boolean;
  /**
   * Asked once the upstream has answered, before any byte of the body is written: `held` when the caller already
   * has a verified file with these bytes (nothing is written; the partial is emptied), `refuse` to fail now.
   */
  beforeBody?: (head: Head) => Promise<{ held: true } | { refuse: string; keepPartial?: boolean } | null>;
  /** A bandwidth limit that every byte written takes from (mirror/bandwidth.ts). */
  throttle?: { slice(): number | null; take(bytes: number, signal?: AbortSignal): Promise<void> };
  /** Flush the file to the disk as it goes and before calling it whole. */
  fsync?: boolean;
  signal?: AbortSignal;
  onProgress?: (p: Progress) => void;
  /** Told when the download waits to try again, and with null once bytes move again. */
  onRetry?: (retry: RetryState | null) => void;
  /** Checks each hop's host and address (the server's own fetches: HANGAR_FETCH_ALLOW). */
  guard?: OutboundGuard;
  log?: (msg: string, fields: Record<string, unknown>) => void;
};

export type ResumableDone = {
  ok: true;
  partialPath: string;
  size: number;
  sha256: string;
  upstreamSha256: string | null;
  etag: string | null;
  /** beforeBody said the caller already holds these bytes: nothing was written. */
  held?: boolean;
};

export type ResumableFailed = {
  ok: false;
  /**
   * cancelled: the signal; refused: the outbound policy or beforeBody; status: an answer asking again will not
   * change (`status`, `text`); no-digest: no sha256 to verify against; mismatch: the bytes are not the file's;
   * disk-full; attempts: maxAttempts tries in a row failed; outage: out of reach for giveUpAfterMs (`quietMs`).
   */
  kind: 'cancelled' | 'refused' | 'status' | 'no-digest' | 'mismatch' | 'disk-full' | 'attempts' | 'outage';
  reason: string;
  keepPartial: boolean;
  partialPath: string | null;
  status?: number;
  /** The start of the answer's body, for a status. */
  text?: string;
  /** What the bytes were, for a mismatch at the end. */
  got?: { size: number; sha256: string; wanted: string | null };
  /** The last try's error, for attempts and outage. */
  last?: string;
  quietMs?: number;
};

class Retryable extends Error {}
/** The upstream is out of reach, or says it is overloaded: with giveUpAfterMs, retried until then, not counted. */
class Unreachable extends Retryable {
  constructor(
    message: string,
    readonly retryAfterMs: number | null = null,
  ) {
    super(message);
  }
}
class Fatal extends Error {
  constructor(
    readonly failure: Omit<ResumableFailed, 'ok' | 'partialPath' | 'keepPartial'> & { keepPartial?: boolean },
  ) {
    super(failure.reason);
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

const SHA256 = /^[0-9a-f]{64}$/;
const unquote = (v: string | null) => v?.replace(/^W\//, '').replace(/^"|"$/g, '') ?? null;

/** The sha256 an upstream publishes for a file (the Hub's X-Linked-Etag, the mirror's ETag), when it looks like one. */
export function upstreamDigest(headers: Headers): string | null {
  for (const name of ['x-linked-etag', 'etag']) {
    const v = unquote(headers.get(name))?.toLowerCase() ?? null;
    if (v && SHA256.test(v)) return v;
  }
  return null;
}

export async function resumableDownload(o: ResumableOptions): Promise<ResumableDone | ResumableFailed> {
  if (o.sink ? o.partialPath !== undefined : o.partialPath === undefined)
    throw new Error('a download goes to a partial path or to a sink: give exactly one');
  // A sink hashes its own bytes: no stream on the hashing thread for it.
  const hash = o.sink ? null : new Sha256();
  try {
    return await attempts(o, hash);
  } finally {
    await hash?.close().catch(() => {});
  }
}

async function attempts(o: ResumableOptions, fileHash: Sha256 | null): Promise<ResumableDone | ResumableFailed> {
  const signal = o.signal ?? new AbortController().signal;
  const sink = o.sink ?? null;
  // Only read where there is no sink (fileHash is null exactly when there is one).
  const hash = fileHash as Sha256;
  const byContent = typeof o.partialPath === 'function' ? o.partialPath : null;
  // Known from the start, or from the first answer's sha256 (byContent); none with a sink.
  let partial: string | null = sink || byContent ? null : (o.partialPath as string);
  let offset = sink?.offset ?? 0;
  if (partial) {
    await fs.mkdir(path.dirname(partial), { recursive: true });
    // After a restart the hash state is gone: re-reading the partial picks it up exactly where the bytes stop.
    // A new download has no partial to read, and its request must not wait for the hashing thread to answer:
    // the first time in a process that means waiting for the thread to start, 150–200 ms before the first
    // request went out under load (bench/mirror.ts, trace). The thread catches up on the first blocks instead.
    const left = (await fs.stat(partial).catch(() => undefined))?.size ?? 0;
    offset = left > 0 ? await hash.addFile(partial) : 0;
  }
  let etag = o.etag ?? null;
  let startedOver = false;
  /** A try began past zero: a file that then fails verification may hold the head of an older version. */
  let resumed = false;
  let upstreamSha256: string | null = null;
  let lastError = 'no attempt was made';
  const giveUpAfter = o.attempts.giveUpAfterMs ?? null;
  const wait = o.attempts.backoffMs ?? ((n: number) => backoffMs(n - 1, { baseMs: 500, maxMs: 60_000 }));
  // Counted from the last byte that arrived: `tries` numbers the tries since (the backoff and the console's
  // "attempt 3"), `misses` those of them that count against maxAttempts.
  let tries = 0;
  let misses = 0;
  let quietSince = Date.now();
  let waiting = false;
  const failed = (f: Omit<ResumableFailed, 'ok' | 'partialPath'>): ResumableFailed => ({
    ok: false,
    partialPath: partial,
    ...f,
  });

  let fh: fs.FileHandle | undefined;
  const startOver = async (why: string) => {
    if (startedOver)
      throw new Fatal({
        kind: 'mismatch',
        reason: `${why} again after starting over once: giving up rather than looping`,
      });
    startedOver = true;
    o.log?.('starting the file over', { url: o.url, why });
    if (sink) await sink.restart();
    else {
      if (fh) await fh.truncate(0);
      else if (partial) await fs.rm(partial, { force: true });
      await hash.reset();
    }
    offset = 0;
  };
  const open = async () => {
    await fh?.close(); // left open by a `continue` (416, a wrong range) that starts the next request
    // Opened before the request when the path is known: the body is read the moment it arrives.
    fh = partial ? await fs.open(partial, 'a') : undefined;
  };

  for (;;) {
    if (signal.aborted) return failed({ kind: 'cancelled', reason: 'cancelled', keepPartial: false });
    tries++;
    const before = offset;
    const stall = new AbortController();
    let total: number | null = null;
    let response: GetResponse | undefined;
    const watch = watchStall(o.stallMs, stall, () => new Retryable(`stalled: no bytes for ${o.stallMs / 1000} s`));
    try {
      await open();
      const headers: Record<string, string> = { ...o.headers, 'accept-encoding': 'identity' };
      if (offset > 0) {
        headers.range = `bytes=${offset}-`;
        // Only a strong validator may guard a byte range (RFC 9110 §13.1.5).
        if (etag && !etag.startsWith('W/')) headers['if-range'] = etag;
        resumed = true;
      }
      const res = await httpGet(o.url, {
        headers,
        signal: AbortSignal.any([signal, stall.signal]),
        guard: o.guard,
      }).catch((err: HttpGetError) => {
        // A host the policy refuses stays refused: retrying would only ask again.
        if (err.code === 'EOUTBOUND') throw new Fatal({ kind: 'refused', reason: `refused: ${err.message}` });
        throw OUT_OF_REACH.has(err.code ?? '') ? new Unreachable(err.message) : err;
      });
      response = res;
      const status = res.status;
      if (status === 416 && offset > 0) {
        res.cancel();
        // `*/N`: the file is N bytes. As long as the part: the part is the whole file, verified below.
        const whole = Number(res.headers.get('content-range')?.match(/^bytes \*\/(\d+)$/)?.[1] ?? Number.NaN);
        if (whole === offset) {
          const done = await finish();
          if (done) return done;
          continue;
        }
        await startOver('the upstream refused the byte range (HTTP 416)');
        continue;
      }
      if (status !== 200 && status !== 206) await refuseStatus(res);
      if (o.refuseHtml && (res.headers.get('content-type') ?? '').includes('text/html')) {
        throw new Retryable('the upstream answered with an HTML page, not the file');
      }
      const newEtag = res.headers.get('etag');
      const published = upstreamDigest(res.headers);
      if (o.expect?.sha256 === 'upstream' && !published) {
        res.cancel();
        throw new Fatal({
          kind: 'no-digest',
          reason: `the upstream did not give the file's sha256 as its ETag (got ${newEtag ?? 'none'}), so the download could not be verified`,
        });
      }
      if (byContent && published && published !== upstreamSha256) {
        // The first answer names the file, or the file changed under a resume: what we held of the old one is
        // of no use, and a part of the new one left by an earlier run is resumed instead.
        if (partial) await fs.rm(partial, { force: true });
        await fh?.close();
        await hash.reset();
        partial = byContent(published);
        await fs.mkdir(path.dirname(partial), { recursive: true });
        upstreamSha256 = published;
        const left = (await fs.stat(partial).catch(() => undefined))?.size ?? 0;
        offset = 0;
        fh = await fs.open(partial, 'a');
        if (left > 0) {
          etag = newEtag ?? etag;
          const head = headOf(res, null, published);
          const verdict = await o.beforeBody?.(head);
          res.cancel();
          if (verdict && 'held' in verdict) return await held(null);
          offset = await hash.addFile(partial);
          tries--; // not a failed try: the next one asks for the rest
          continue;
        }
      }
      upstreamSha256 = published ?? upstreamSha256;
      if (!sink && (!partial || !fh))
        throw new Fatal({ kind: 'no-digest', reason: 'the upstream published no sha256 to name the file by' });

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
          const changed = etag && newEtag && unquote(etag) !== unquote(newEtag);
          await startOver(
            changed ? 'the upstream file changed (new ETag)' : 'the upstream ignored the byte range (HTTP 200)',
          );
        }
        const length = res.headers.get('content-length');
        total = length === null ? null : Number(length);
      }
      etag = newEtag ?? etag;
      const size = o.expect?.size;
      if (size != null && total !== null && total !== size) {
        throw new Fatal({
          kind: 'mismatch',
          reason: `the upstream says the file is ${total} bytes; ${size} were expected`,
        });
      }
      if (o.refuseEmpty && total === 0) throw new Retryable('the upstream sent an empty body');
      const verdict = await o.beforeBody?.(headOf(res, total, upstreamSha256));
      if (verdict && 'held' in verdict) {
        res.cancel();
        return await held(total);
      }
      if (verdict) throw new Fatal({ kind: 'refused', reason: verdict.refuse, keepPartial: verdict.keepPartial });
      o.onProgress?.({ bytesDone: offset, bytesTotal: total, etag, upstreamSha256 });

      const at = { offset };
      const file = fh;
      const into = (opts: Parameters<typeof receiveInto>[4]) =>
        sink ? receiveIntoSink(res, sink, at, opts) : receiveInto(res, file as fs.FileHandle, hash, at, opts);
      try {
        await into({
          check: (handed) => {
            if (size != null && handed > size)
              throw new Fatal({
                kind: 'mismatch',
                reason: `the upstream sent more than the ${size} bytes the file has`,
              });
          },
          onBytes: watch.heard,
          throttle: o.throttle && {
            slice: () => o.throttle?.slice() ?? null,
            take: async (n) => {
              await o.throttle?.take(n, signal);
              watch.heard(n); // waiting on the limit is not a stalled upstream
            },
          },
          onWritten: (bytesDone) => {
            if (waiting) {
              waiting = false;
              o.onRetry?.(null);
            }
            o.onProgress?.({ bytesDone, bytesTotal: total, etag, upstreamSha256 });
          },
          // On the disk before it is called whole: the caller puts it in place next, and a crash of the machine
          // after that must not leave a listed file whose last bytes were only ever in memory.
          fsync: o.fsync,
        });
      } finally {
        offset = at.offset; // what the partial holds, whatever happened
      }
      if (total !== null && offset < total) throw new Retryable(`the connection ended at ${offset} of ${total} bytes`);
      if (o.refuseEmpty && offset === 0) throw new Retryable('the upstream sent an empty body');
      const done = await finish();
      if (done) return done;
    } catch (caught) {
      await fh?.close().catch(() => {});
      fh = undefined;
      const err = stall.signal.aborted && !signal.aborted ? stall.signal.reason : caught;
      stall.abort();
      response?.cancel(); // a body left half-read would hold its socket open
      if (signal.aborted) return failed({ kind: 'cancelled', reason: 'cancelled', keepPartial: false });
      if ((err as NodeJS.ErrnoException)?.code === 'ENOSPC') {
        return failed({
          kind: 'disk-full',
          reason: `the disk is full after ${offset} bytes: the partial is kept; free space and retry`,
          keepPartial: true,
        });
      }
      if (err instanceof Fatal) return failed({ keepPartial: false, ...err.failure });
      // Whatever was written before the error is good: the hash and offset only move with bytes on disk. But a
      // write that failed half-way leaves the file longer than the offset, so cut it back to what was hashed.
      if (partial) await fs.truncate(partial, offset).catch(() => {});
      // A sink whose write failed goes back to its last checkpoint: the next try asks from there.
      if (sink) {
        await sink.recover();
        offset = sink.offset;
      }
      lastError = describe(err, offset, total);
      // A stall with nothing received is a timeout: the upstream is not answering.
      const stalled = stall.signal.aborted && err === stall.signal.reason && offset === before;
      const outage =
        giveUpAfter !== null &&
        (err instanceof Unreachable || stalled || OUT_OF_REACH.has((err as NodeJS.ErrnoException)?.code ?? ''));
      if (offset > before) {
        // Bytes moved: whatever went wrong, the upstream is there and the file is getting closer.
        tries = 1;
        misses = 0;
        quietSince = Date.now();
      } else if (!outage) misses++;
      const quiet = Date.now() - quietSince;
      o.log?.('transfer interrupted; will resume', { url: o.url, attempt: tries, at: offset, error: lastError });
      if (!outage && misses >= o.attempts.maxAttempts) {
        return failed({
          kind: 'attempts',
          reason: `gave up after ${misses} attempts; the last: ${lastError}`,
          last: lastError,
          keepPartial: true,
        });
      }
      if (outage && giveUpAfter !== null && quiet >= giveUpAfter) {
        return failed({
          kind: 'outage',
          reason: `gave up: no byte arrived for ${formatDuration(quiet)}; the last: ${lastError}; retry continues from the partial`,
          last: lastError,
          quietMs: quiet,
          keepPartial: true,
        });
      }
      // Retry-After is honoured even past the cap (the upstream knows its own outage), but never past the deadline:
      // then one last try is made when it falls due.
      const asked = err instanceof Unreachable ? err.retryAfterMs : null;
      const deadline = giveUpAfter === null ? Number.POSITIVE_INFINITY : giveUpAfter - quiet;
      const ms = Math.max(0, Math.min(Math.max(wait(tries), asked ?? 0), deadline));
      waiting = true;
      o.onRetry?.({ attempt: tries + 1, nextAt: new Date(Date.now() + ms), reason: lastError });
      await sleep(ms, signal).catch(() => {}); // an abort ends the wait; the loop's top says cancelled
    } finally {
      watch.stop();
    }
  }

  function headOf(res: GetResponse, total: number | null, sha: string | null): Head {
    return { status: res.status, headers: res.headers, total, offset, upstreamSha256: sha, partialPath: partial ?? '' };
  }

  /** The caller holds these bytes already: the partial is emptied, and nothing more is fetched. */
  async function held(total: number | null): Promise<ResumableDone> {
    if (sink) await sink.drop();
    else if (fh) {
      await fh.truncate(0);
      await fh.close();
      fh = undefined;
    }
    const sha = upstreamSha256 ?? '';
    return { ok: true, partialPath: partial ?? '', size: total ?? 0, sha256: sha, upstreamSha256, etag, held: true };
  }

  /**
   * The part holds the whole file: verified, or removed. Undefined to try again from zero (a resumed file that
   * does not verify may hold the head of an older version).
   */
  async function finish(): Promise<ResumableDone | undefined> {
    await fh?.close();
    fh = undefined;
    const sha256 = sink ? (await sink.finish()).sha256 : await hash.digest();
    const size = o.expect?.size;
    const wanted = o.expect?.sha256 === 'upstream' ? upstreamSha256 : (o.expect?.sha256 ?? null);
    const mismatch =
      size != null && offset !== size
        ? `the file is ${offset} bytes, but ${size} were expected`
        : wanted && sha256 !== wanted
          ? `the file's sha256 is ${sha256}, but ${o.expect?.sha256 === 'upstream' ? 'the upstream says' : 'it should be'} ${wanted}`
          : null;
    if (!mismatch) return { ok: true, partialPath: partial ?? '', size: offset, sha256, upstreamSha256, etag };
    if (resumed && !startedOver) {
      await startOver(`${mismatch} (after a resume)`);
      return undefined;
    }
    if (sink) await sink.drop();
    else if (partial) await fs.rm(partial, { force: true });
    throw new Fatal({ kind: 'mismatch', reason: mismatch, got: { size: offset, sha256, wanted } });
  }
}

/** An answer other than the file: a Fatal when asking again will not change it, else Unreachable. */
async function refuseStatus(res: GetResponse): Promise<never> {
  const status = res.status;
  // The Hub says why in X-Error-Message ("Entry not found", "Access to model … is restricted").
  const why = res.headers.get('x-error-message');
  const said = why ? `: ${why.slice(0, 200)}` : '';
  if (status === 429 || status === 408 || status >= 500) {
    res.cancel();
    throw new Unreachable(
      `the upstream answered HTTP ${status}${status === 429 ? ' (too many requests)' : ''}`,
      retryAfterMs(res.headers.get('retry-after')),
    );
  }
  const text = (await bodyText(res, 200)).trim();
  const reason =
    status === 404 || status === 410
      ? `the upstream has no such file (HTTP ${status}${said})`
      : status === 401 || status === 403
        ? `the upstream refused access (HTTP ${status}${said})`
        : status === 400
          ? `the upstream refused the request (HTTP 400${said})`
          : `the upstream answered HTTP ${status}${said}`;
  throw new Fatal({ kind: 'status', reason, status, text });
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
