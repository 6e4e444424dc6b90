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

// The formatter's zone is fixed when it is made: asked once, not for every row a long list renders.
const absoluteZone = absolute.resolvedOptions().timeZone;

/** The exact instant, in the reader's time zone, with the zone named. */
export function formatAbsolute(date: Date): string {
  return `${absolute.format(date)} (${absoluteZone})`;
}

// The server's refusals name the field they are about as a GraphQL path ("input.newPassword: at least 12
// characters", "sources.0.url: an absolute URL"): exact for scripts, but not words for a person at a form.

const PATH_PREFIX = /^([A-Za-z_]\w*(?:\.\w+)+): /;

/** "input.newPassword" → "New password", "sources.0.url" → "Source 1 URL", "params.rank" → "Rank". */
export function fieldLabel(path: string): string {
  const parts = path.split('.').filter((p) => p !== 'input');
  const words = parts.map((p, i) => {
    if (/^\d+$/.test(p)) return String(Number(p) + 1);
    const spaced = p
      .replace(/MiB/g, ' mib ')
      .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
      .replace(/_/g, ' ')
      .trim()
      .toLowerCase()
      .split(/\s+/)
      .map((w) => ACRONYMS[w] ?? w)
      .join(' ');
    // A list's name before its index reads in the singular: "sources 1" is "Source 1".
    return /^\d+$/.test(parts[i + 1] ?? '') && spaced.endsWith('s') ? spaced.slice(0, -1) : spaced;
  });
  const text = words.join(' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

const ACRONYMS: Record<string, string> = { url: 'URL', id: 'ID', gpu: 'GPU', mib: 'MiB', gguf: 'GGUF' };

/** A refusal as a person reads it under the form: a leading GraphQL path named by its label. */
export function readableRefusal(message: string): string {
  const m = message.match(PATH_PREFIX);
  return m?.[1] ? `${fieldLabel(m[1])}: ${message.slice(m[0].length)}` : message;
}

/** A refusal shown at its own field, where the label is already beside it: the leading path goes. */
export function atFieldRefusal(message: string): string {
  return message.replace(PATH_PREFIX, '');
}
