// Sizes as people read them in messages (a serve job's steps, refusals): the same binary units the console
// shows, so a number in a log line and on a page agree.

/** 1536 → "1.5 KiB", 734003200 → "700.0 MiB"; bytes below 1 KiB as bytes. */
export function formatBytes(n: number): string {
  if (!Number.isFinite(n) || n < 1024) return `${n} bytes`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}
