import { useSyncExternalStore } from 'react';
import { formatAbsolute, formatRelative } from '../../lib/format';

// One shared clock for every relative time on the page: it ticks every 15 s while something shows a time.
let tick = 0;
const listeners = new Set<() => void>();
let timer: ReturnType<typeof setInterval> | undefined;

function subscribe(listener: () => void) {
  listeners.add(listener);
  timer ??= setInterval(() => {
    tick++;
    for (const l of listeners) l();
  }, 15_000);
  return () => {
    listeners.delete(listener);
    if (listeners.size === 0 && timer) {
      clearInterval(timer);
      timer = undefined;
    }
  };
}

/** Re-renders the caller every 15 s. */
export function useClockTick(): number {
  return useSyncExternalStore(
    subscribe,
    () => tick,
    () => tick,
  );
}

/** A relative time ("5 minutes ago") with the exact instant in its title. */
export function TimeAgo({ at, empty = '—' }: { at: string | null | undefined; empty?: string }) {
  useClockTick();
  if (!at) return <span className="muted">{empty}</span>;
  const date = new Date(at);
  return (
    <time dateTime={at} title={formatAbsolute(date)}>
      {formatRelative(date)}
    </time>
  );
}
