import { describe, expect, it } from 'vitest';
import { coalesced } from './coalesce.js';

describe('a coalesced read', () => {
  it('runs once more after a burst of asks made while it ran, and not once per ask', async () => {
    let runs = 0;
    let release: () => void = () => {};
    const read = coalesced(async () => {
      runs++;
      if (runs === 1) await new Promise<void>((r) => (release = r));
    });
    const first = read();
    const asks = Array.from({ length: 10 }, () => read());
    expect(asks.every((p) => p === first)).toBe(true);
    release();
    await first;
    expect(runs).toBe(2);
    await read();
    expect(runs).toBe(3);
  });

  it('ends the sequence when a run answers false, and starts afresh on the next ask', async () => {
    let runs = 0;
    let release: () => void = () => {};
    const read = coalesced(async () => {
      runs++;
      if (runs === 1) {
        await new Promise<void>((r) => (release = r));
        return false;
      }
    });
    const first = read();
    void read();
    release();
    await first;
    expect(runs).toBe(1);
    await read();
    expect(runs).toBe(2);
  });
});
