import {
  formatDuration,
  type ResumableFailed,
  type RetryState,
  resumableDownload,
} from '@hangar/common/download/resumable';
import type { DownloadSink } from '@hangar/common/download/sink';
import type { OutboundGuard } from '@hangar/common/outbound';
import { backoffMs } from '@hangar/common/retry';

export { formatDuration, type RetryState, upstreamDigest } from '@hangar/common/download/resumable';
export { retryAfterMs } from '@hangar/common/retry';

// One file from an upstream to the mirror's partial path, or into its bucket's resumable write (a sink:
// store/fetch-into-store.ts): the API the mirror's worker calls, over the one resumable download every part of
// Hangar shares (lib/download/resumable.ts), so both stores keep the same rules. The mirror's rules, as options
// there, each from a way downloads go wrong in practice:
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

export type TransferOptions = {
  url: string;
  /** Where the bytes gather on disk; or `sink`, the bucket's resumable write (exactly one of the two). */
  partialPath?: string;
  sink?: DownloadSink;
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
   * None for a bucket: it tells no free space.
   */
  reserveSpace?: (bytes: number) => Promise<string | null>;
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

/**
 * Brings the file to its partial path by the one resumable download (lib/download/resumable.ts) with the
 * mirror's rules: outages ride out giveUpAfterMs, HTML pages and empty bodies are never the file, a held file
 * is linked rather than fetched, room on the disk is reserved before the bytes come.
 */
export async function transfer(o: TransferOptions): Promise<TransferDone | TransferFailed> {
  const cap = o.retryMaxMs ?? 60_000;
  const result = await resumableDownload({
    url: o.url,
    partialPath: o.partialPath,
    sink: o.sink,
    headers: o.headers,
    etag: o.etag,
    attempts: {
      maxAttempts: o.maxAttempts,
      giveUpAfterMs: o.giveUpAfterMs ?? 6 * 3_600_000,
      backoffMs: o.backoffMs ?? ((n) => backoffMs(n - 1, { baseMs: 500, maxMs: cap })),
    },
    stallMs: o.stallMs,
    expect: { size: o.expectedSize },
    refuseHtml: true,
    refuseEmpty: true,
    beforeBody: async (head) => {
      if (o.alreadyHeld && head.upstreamSha256 && (await o.alreadyHeld(head.upstreamSha256, head.total)))
        return { held: true };
      if (head.total === null) return null;
      const noRoom = (await o.reserveSpace?.(head.total - head.offset)) ?? null;
      return noRoom ? { refuse: noRoom, keepPartial: true } : null;
    },
    throttle: o.throttle,
    fsync: o.fsync,
    signal: o.signal,
    onProgress: ({ bytesDone, bytesTotal, etag }) => o.onProgress({ bytesDone, bytesTotal, etag }),
    onRetry: o.onRetry,
    guard: o.guard,
    log: o.log,
  });
  if (result.ok) {
    const { size, sha256, upstreamSha256, etag, held } = result;
    return held
      ? { ok: true, size, sha256, upstreamSha256, etag, held }
      : { ok: true, size, sha256, upstreamSha256, etag };
  }
  return { ok: false, reason: mirrorReason(result), keepPartial: result.keepPartial };
}

/** The routine's reasons in the mirror's words: what an operator sets to change the outcome. */
function mirrorReason(f: ResumableFailed): string {
  if (f.kind === 'status' && (f.status === 401 || f.status === 403))
    return `${f.reason}: a gated repository needs HANGAR_HUB_TOKEN`;
  if (f.kind === 'outage')
    return `gave up: no byte arrived for ${formatDuration(f.quietMs ?? 0)} (HANGAR_MIRROR_GIVE_UP_AFTER); the last: ${f.last}; retry continues from the partial`;
  return f.reason;
}
