const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/**
 * Binary units throughout the console (1 GiB = 2^30 bytes), the unit GPU memory is reported in: a model's size,
 * a node's free disk and a GPU's free memory compare directly, without a 7 % difference hiding between GB and GiB.
 */
export function formatBytes(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/** A transfer rate: "12 MiB/s". */
export function formatRate(bytesPerSecond: number): string {
  return `${formatBytes(Math.round(bytesPerSecond))}/s`;
}

/** A duration to come, to the precision an operator plans with: "40 s", "3 min", "2 h 5 min", "3 d 4 h". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.min(59, Math.round(s / 60))} min`;
  if (s < 86_400) {
    const minutes = Math.floor((s % 3600) / 60);
    return `${Math.floor(s / 3600)} h${minutes ? ` ${minutes} min` : ''}`;
  }
  const hours = Math.floor((s % 86_400) / 3600);
  return `${Math.floor(s / 86_400)} d${hours ? ` ${hours} h` : ''}`;
}

/** The first 12 hex digits of a sha256: enough to compare by eye; the whole digest goes in a title. */
export function shortSha(sha256: string): string {
  return sha256.length > 12 ? `${sha256.slice(0, 12)}…` : sha256;
}

const compact = new Intl.NumberFormat('en', { notation: 'compact', maximumFractionDigits: 1 });

/** A registry count (downloads, likes) at a glance: "950", "12.3K", "4.1M"; the exact number goes in a title. */
export function formatCount(n: number): string {
  return compact.format(n);
}

/** GPU memory, as nvidia-smi reports it: MiB, shown in GiB. */
export function formatMiB(mib: number): string {
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${mib} MiB`;
}

const relative = new Intl.RelativeTimeFormat('en', { numeric: 'auto' });
const steps: [Intl.RelativeTimeFormatUnit, number][] = [
  ['second', 60],
  ['minute', 60],
  ['hour', 24],
  ['day', 30],
  ['month', 12],
  ['year', Number.POSITIVE_INFINITY],
];

/** "3 minutes ago", "in 2 days", "now". */
export function formatRelative(date: Date, now: number = Date.now()): string {
  let value = (date.getTime() - now) / 1000;
  if (Math.abs(value) < 10) return 'just now';
  for (const [unit, size] of steps) {
    if (Math.abs(value) < size) return relative.format(Math.round(value), unit);
    value /= size;
  }
  return relative.format(Math.round(value), 'year');
}

const absolute = new Intl.DateTimeFormat('en-GB', {
  dateStyle: 'medium',
  timeStyle: 'medium',
});

/** The exact instant, in the reader's time zone, with the zone named. */
export function formatAbsolute(date: Date): string {
  return `${absolute.format(date)} (${absolute.resolvedOptions().timeZone})`;
}
