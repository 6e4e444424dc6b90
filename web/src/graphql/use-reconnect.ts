import { useEffect } from 'react';
import { live } from './live';

/**
 * Reads a view's query again from the server after the socket comes back: events sent while it was down are not
 * replayed. `enabled` false for views that need not (a later page of a list, which only the first page's events
 * would change).
 */
export function useRefetchOnReconnect(
  refetch: (opts: { requestPolicy: 'network-only' }) => void,
  enabled = true,
): void {
  useEffect(() => {
    if (!enabled) return;
    return live.onReconnect(() => refetch({ requestPolicy: 'network-only' }));
  }, [enabled, refetch]);
}
