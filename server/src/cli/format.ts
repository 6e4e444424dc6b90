// How the CLI writes sizes, rates and times for a person; --json prints the raw numbers instead.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function bytes(n: number | null | undefined) {
  if (n == null) return '?';
  let v = n;
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${UNITS[u]}`;
}

export function rate(bytesPerSecond: number | null | undefined) {
  return bytesPerSecond == null ? '' : `${bytes(Math.round(bytesPerSecond))}/s`;
}

export function duration(seconds: number | null | undefined) {
  if (seconds == null || !Number.isFinite(seconds)) return '';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/** Columns padded to the widest cell: what `ls` prints when nobody asked for --json. */
export function table(header: string[], rows: (string | number | null | undefined)[][]) {
  const cells = [header, ...rows.map((r) => r.map((c) => (c == null ? '' : String(c))))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells
    .map((r) => r.map((c, i) => (i === r.length - 1 ? c : (c ?? '').padEnd(widths[i] ?? 0))).join('  '))
    .join('\n');
}
