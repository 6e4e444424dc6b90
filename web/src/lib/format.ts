const units = ['B', 'KB', 'MB', 'GB', 'TB', 'PB'];

/** Decimal units, as disks and the Hub count them: 1 GB = 10^9 bytes. */
export function formatBytes(bytes: number): string {
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
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
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  return `${absolute.format(date)} (${zone})`;
}
