import fs from 'node:fs/promises';
import { resumableDownload } from '@hangar/common/download/resumable';
import { backoffMs } from '@hangar/common/retry';

// A training job's files (the pairs, the base weights) fetched to disk for the trainer, through the one resumable
// download; the rules a job's files need (a few tries, the spec's size and sha256, the token to Hangar alone).

export type DownloadOptions = {
  /** Checked once the whole file is there; a mismatch deletes it and fails (no point fetching it again). */
  sha256?: string | null;
  bytes?: number | null;
  signal?: AbortSignal;
  /** Tries, each resuming where the last stopped; a try that moved bytes starts the count again. */
  attempts?: number;
  backoffMs?: number;
  /** Without a byte for this long, a transfer counts as stalled and is tried again. */
  stallMs?: number;
};

/** A download that asking again will not fix: a 4xx, or bytes that are not the ones the spec names. */
export class DownloadError extends Error {
  override name = 'DownloadError';
}

/**
 * Fetches `url` to `dest` through `<dest>.part`, resuming a part left by an earlier try (or an earlier run) with
 * Range, and checks the size and sha256 the spec gives before the file takes its name (the one resumable
 * download, lib/download/resumable.ts). The node token goes only to `auth.origin`: base weights from the
 * registry must not carry Hangar's credentials to another host.
 */
export async function downloadFile(
  url: string,
  dest: string,
  o: DownloadOptions & { auth?: { origin: string; token: string } } = {},
): Promise<{ bytes: number; sha256: string }> {
  const headers: Record<string, string> = {};
  if (o.auth && new URL(url).origin === o.auth.origin) headers.authorization = `Bearer ${o.auth.token}`;
  const attempts = o.attempts ?? 5;
  const result = await resumableDownload({
    url,
    partialPath: `${dest}.part`,
    headers,
    // Every failed try counts (no outage deadline): a job waits minutes, not hours, for its files.
    attempts: {
      maxAttempts: attempts,
      backoffMs: (n) => backoffMs(n - 1, { baseMs: o.backoffMs ?? 1000, maxMs: 10_000 }),
    },
    stallMs: o.stallMs ?? 30_000,
    expect: { size: o.bytes, sha256: o.sha256 },
    fsync: true,
    signal: o.signal,
  });
  if (result.ok) {
    await fs.rename(result.partialPath, dest);
    return { bytes: result.size, sha256: result.sha256 };
  }
  if (result.kind === 'cancelled') throw o.signal?.reason ?? new Error('cancelled');
  if (result.kind === 'attempts')
    throw new DownloadError(`${url} could not be fetched in ${attempts} tries: ${result.last}`);
  if (result.kind === 'status')
    throw new DownloadError(`${url} answered ${result.status}${result.text ? `: ${result.text}` : ''}`);
  if (result.kind === 'mismatch' && result.got) {
    const { size, sha256, wanted } = result.got;
    const what =
      o.bytes != null && size !== o.bytes
        ? `${url} is ${size} bytes, but the job says ${o.bytes}`
        : `${url} has sha256 ${sha256}, but the job says ${wanted}`;
    throw new DownloadError(`${what}: the file was not kept`);
  }
  throw new DownloadError(`${url}: ${result.reason}`);
}
