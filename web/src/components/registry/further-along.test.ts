import { describe, expect, it } from 'vitest';
import { furtherAlong } from './file-set-row';

// The fetch answer under a registry set reads the version once and follows its events; a read answered before the
// last event but delivered after it left "verifying 99.9 %" on screen for good, beside a version already present.
describe('the reading of a version shown under a fetched set', () => {
  const v = (state: string, bytesDone: number) => ({ state, bytesDone }) as never;

  it('keeps the event that is further along than a late read', () => {
    expect(furtherAlong(v('PRESENT', 100), v('VERIFYING', 99))).toEqual({ state: 'PRESENT', bytesDone: 100 });
    expect(furtherAlong(v('FETCHING', 60), v('FETCHING', 40))).toEqual({ state: 'FETCHING', bytesDone: 60 });
  });

  it('takes a read that is further along than the last event, and either alone', () => {
    expect(furtherAlong(v('FETCHING', 10), v('PRESENT', 100))).toEqual({ state: 'PRESENT', bytesDone: 100 });
    expect(furtherAlong(v('FAILED', 10), v('FETCHING', 10))).toEqual({ state: 'FAILED', bytesDone: 10 });
    expect(furtherAlong(undefined, v('QUEUED', 0))).toEqual({ state: 'QUEUED', bytesDone: 0 });
    expect(furtherAlong(undefined, undefined)).toBeUndefined();
  });
});
