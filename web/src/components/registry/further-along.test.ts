import { describe, expect, it } from 'vitest';
import { furtherAlong } from './file-set-row';

// The fetch answer under a registry set reads the version once and follows its events; a read answered before the
// last event but delivered after it left "verifying 99.9 %" on screen for good, beside a version already present.
describe('the reading of a version shown under a fetched set', () => {
  const v = (state: string, bytesDone: number, updatedAt: string | null = null) =>
    ({ state, bytesDone, updatedAt }) as never;

  it('keeps the event that is further along than a late read', () => {
    expect(furtherAlong(v('PRESENT', 100), v('VERIFYING', 99))).toEqual(v('PRESENT', 100));
    expect(furtherAlong(v('FETCHING', 60), v('FETCHING', 40))).toEqual(v('FETCHING', 60));
  });

  it('takes a read that is further along than the last event, and either alone', () => {
    expect(furtherAlong(v('FETCHING', 10), v('PRESENT', 100))).toEqual(v('PRESENT', 100));
    expect(furtherAlong(v('FAILED', 10), v('FETCHING', 10))).toEqual(v('FAILED', 10));
    expect(furtherAlong(undefined, v('QUEUED', 0))).toEqual(v('QUEUED', 0));
    expect(furtherAlong(undefined, undefined)).toBeUndefined();
  });

  it('follows a retried version back from FAILED: the later write wins over the stage', () => {
    const failed = v('FAILED', 10, '2026-12-07T10:00:00.000Z');
    const again = v('QUEUED', 0, '2026-12-07T10:00:05.000Z');
    expect(furtherAlong(again, failed)).toBe(again);
    // …and a late read of an older write never wins over a newer event, whatever its stage.
    const present = v('PRESENT', 100, '2026-12-07T10:01:00.000Z');
    expect(furtherAlong(present, v('VERIFYING', 99, '2026-12-07T10:00:59.000Z'))).toBe(present);
    // The same write: progress between writes, told apart by bytes.
    const same = '2026-12-07T10:00:30.000Z';
    expect(furtherAlong(v('FETCHING', 60, same), v('FETCHING', 70, same))).toEqual(v('FETCHING', 70, same));
  });
});
