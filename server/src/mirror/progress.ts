import type { MirrorFileState } from '../generated/prisma/enums.js';

type FileLike = {
  state: MirrorFileState;
  bytesDone: bigint | number;
  bytesTotal: bigint | number | null;
  bytesPerSecond: number | null;
};

// A version is what an operator sees: one row, however many files. Its state and progress are summed from its
// files, so a fifteen-shard model fills one bar once instead of restarting it fifteen times.

export type VersionState = 'QUEUED' | 'FETCHING' | 'VERIFYING' | 'PRESENT' | 'FAILED' | 'CANCELLED' | 'PAUSED';

export function versionState(files: readonly Pick<FileLike, 'state'>[]): VersionState {
  const has = (s: MirrorFileState) => files.some((f) => f.state === s);
  if (has('FETCHING')) return 'FETCHING';
  if (has('VERIFYING')) return 'VERIFYING';
  if (has('QUEUED')) return files.every((f) => f.state === 'QUEUED') ? 'QUEUED' : 'FETCHING';
  if (has('PAUSED')) return 'PAUSED';
  if (has('FAILED')) return 'FAILED';
  if (files.length > 0 && files.every((f) => f.state === 'PRESENT')) return 'PRESENT';
  return 'CANCELLED';
}

export type VersionProgress = {
  bytesDone: number;
  /** Null while any file's size is unknown: a total that leaves a file out would be a lie about the end. */
  bytesTotal: number | null;
  /** Only when the total is known: never an invented percentage. */
  percent: number | null;
  bytesPerSecond: number | null;
  etaSeconds: number | null;
};

export function versionProgress(files: readonly FileLike[]): VersionProgress {
  const bytesDone = files.reduce((n, f) => n + Number(f.bytesDone), 0);
  const totals = files.map((f) => (f.bytesTotal === null ? null : Number(f.bytesTotal)));
  const bytesTotal = totals.every((t) => t !== null) ? totals.reduce<number>((n, t) => n + (t ?? 0), 0) : null;
  // Zero while the files arriving hear nothing (an outage, a wait to retry): a rate, but no ETA.
  const active = files.filter((f) => f.state === 'FETCHING' && f.bytesPerSecond !== null);
  const bytesPerSecond = active.length ? active.reduce((n, f) => n + (f.bytesPerSecond ?? 0), 0) : null;
  // Capped below 100 until every file is verified: "100 %" on a file still being checked reads as done.
  const percent =
    bytesTotal === null || bytesTotal === 0
      ? null
      : Math.min(versionState(files) === 'PRESENT' ? 100 : 99.9, Math.floor((bytesDone / bytesTotal) * 1000) / 10);
  const etaSeconds =
    bytesTotal !== null && bytesPerSecond ? Math.max(0, Math.round((bytesTotal - bytesDone) / bytesPerSecond)) : null;
  return { bytesDone, bytesTotal, percent, bytesPerSecond, etaSeconds };
}

/**
 * The family a model's name puts it in: the letters it starts with. "qwen2.5-coder-7b" and "qwen3-8b" are
 * qwen, "deepseek-r1-distill-qwen-14b" is deepseek: how people talk about them, and all a name says. One letter
 * is no family ("t5-small" is t5, "e5-large" e5, not t and e), nor is a start with a digit or a symbol: those
 * keep their first part whole.
 */
export function modelFamily(model: string): string {
  const name = model.toLowerCase();
  const letters = name.match(/^[a-z]+/)?.[0];
  return letters && letters.length > 1 ? letters : (name.split('-')[0] ?? name);
}

const rank: Record<VersionState, number> = {
  FETCHING: 0,
  VERIFYING: 0,
  QUEUED: 0,
  FAILED: 1,
  PAUSED: 1,
  PRESENT: 2,
  CANCELLED: 3,
};

/** Arriving first, then failed, then held; within a state by model and version, so rows stay put while bytes tick. */
export function compareVersions(a: { state: VersionState; model: string; version: string }, b: typeof a): number {
  return rank[a.state] - rank[b.state] || a.model.localeCompare(b.model) || a.version.localeCompare(b.version);
}
