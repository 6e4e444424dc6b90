// The WebSocket's state, for views that show "live" and refetch after a reconnect (events sent while the socket
// was down are not replayed: a view that reconnects reads the current state instead).
export type LiveState = 'connecting' | 'live' | 'reconnecting' | 'stopped';

let state: LiveState = 'connecting';
const listeners = new Set<() => void>();
const reconnectListeners = new Set<() => void>();

export const live = {
  get: () => state,
  subscribe(listener: () => void) {
    listeners.add(listener);
    return () => void listeners.delete(listener);
  },
  /** Called after the socket comes back: refetch what may have changed while it was down. */
  onReconnect(listener: () => void) {
    reconnectListeners.add(listener);
    return () => void reconnectListeners.delete(listener);
  },
  set(next: LiveState, reconnected = false) {
    if (next !== state) {
      state = next;
      for (const l of listeners) l();
    }
    if (reconnected) for (const l of reconnectListeners) l();
  },
};

/** graphql-ws closes with 4403 when the server refuses the connection: the session has ended. */
export const FORBIDDEN_CLOSE = 4403;
/** The server closes a live connection with 4401 when its session ends (signed out, the user disabled). */
export const UNAUTHORIZED_CLOSE = 4401;

/** Whether a close means the session is over: retrying would only be refused again. */
export function sessionEnded(event: unknown): boolean {
  const code = closeCode(event);
  return code === FORBIDDEN_CLOSE || code === UNAUTHORIZED_CLOSE;
}

export function closeCode(event: unknown): number | undefined {
  return typeof event === 'object' && event !== null && 'code' in event && typeof event.code === 'number'
    ? event.code
    : undefined;
}
