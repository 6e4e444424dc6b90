import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { follow } from './watch.js';

// follow() without a server: the events drive what is shown, the reads of the current state only fill a gap,
// and SIGINT ends the watch (the caller prints how to watch again) without waiting for the stream.

type Step = { n: number; done: boolean };

function stream(values: Step[], hang = false) {
  return (async function* () {
    for (const v of values) {
      await new Promise((r) => setTimeout(r, 5));
      yield v;
    }
    if (hang) await new Promise(() => {});
  })();
}

describe('follow', () => {
  it('shows each event until one says the job ended', async () => {
    const shown: number[] = [];
    const outcome = await follow<Step>({
      first: { n: 0, done: false },
      events: stream([1, 2, 3, 4].map((n) => ({ n, done: n === 3 }))),
      current: async () => null,
      show: (s) => {
        shown.push(s.n);
        return s.done;
      },
      onInterrupt: () => {},
    });
    expect(outcome).toBe('finished');
    expect(shown).toEqual([0, 1, 2, 3]);
  });

  it('subscribes to nothing when the job had already ended', async () => {
    let opened = false;
    const events = (async function* () {
      opened = true;
      yield { n: 1, done: true };
    })();
    const outcome = await follow<Step>({
      first: { n: 0, done: true },
      events,
      current: async () => null,
      show: (s) => s.done,
      onInterrupt: () => {},
    });
    expect(outcome).toBe('finished');
    expect(opened).toBe(false);
  });

  it('reads the state when a change came before the stream opened', async () => {
    const outcome = await follow<Step>({
      first: { n: 0, done: false },
      events: stream([], true),
      current: async () => ({ n: 9, done: true }),
      show: (s) => s.done,
      onInterrupt: () => {},
    });
    expect(outcome).toBe('finished');
  });

  it('ends on SIGINT, telling the caller, with the stream still open', async () => {
    const proc = new EventEmitter() as unknown as NodeJS.Process;
    let told = 0;
    const watching = follow<Step>({
      first: { n: 0, done: false },
      events: stream([{ n: 1, done: false }], true),
      current: async () => null,
      show: () => false,
      onInterrupt: () => {
        told++;
      },
      signal: proc,
    });
    await new Promise((r) => setTimeout(r, 30));
    proc.emit('SIGINT');
    expect(await watching).toBe('interrupted');
    expect(told).toBe(1);
    expect((proc as unknown as EventEmitter).listenerCount('SIGINT')).toBe(0);
  });
});
