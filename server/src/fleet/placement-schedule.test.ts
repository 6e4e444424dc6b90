import { describe, expect, it } from 'vitest';
import type { Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import { makePubSub } from '../pubsub.js';
import { type PassOutcome, PlacementSchedule, passOutcome } from './placement-schedule.js';

// When a look runs the placement pass, without a database: the pass is counted, the nodes online and the clock are
// set by the test. The paths no event announces are the ones checked here: the events' connection lost and back,
// a pass left unfinished, time passing an awake-until. (placement-events.test.ts runs the real thing.)

function setup(o: { listening?: () => number | undefined; outcome?: PassOutcome; online?: string } = {}) {
  let nowMs = 1_000_000;
  let online = o.online ?? 'a';
  const placement = {
    passes: 0,
    outcome: o.outcome ?? ({ online: 'a', settled: true, dueAt: null } as PassOutcome | undefined),
    lastPassAt: performance.now(),
    running: () => false,
    onlineNow: async () => online,
    async place() {
      this.passes++;
      this.lastPassAt = performance.now();
    },
  };
  let since: number | undefined = 1;
  const schedule = new PlacementSchedule({
    db: { clock: { nowMs: () => nowMs } } as unknown as Db,
    placement,
    health: new LoopHealth('placement', undefined),
    events: { pubsub: makePubSub(), listeningSince: o.listening ?? (() => since) },
    rereadMs: 86_400_000,
  });
  schedule.start();
  return {
    schedule,
    placement,
    setNow: (ms: number) => {
      nowMs = ms;
    },
    setOnline: (key: string) => {
      online = key;
    },
    setSince: (s: number | undefined) => {
      since = s;
    },
  };
}

describe('the placement schedule', () => {
  it('runs no pass while nothing changed', async () => {
    const s = setup();
    for (let i = 0; i < 3; i++) await s.schedule.look();
    expect(s.placement.passes).toBe(0);
  });

  it('runs a pass when the nodes online are not those the last pass saw', async () => {
    const s = setup();
    s.setOnline('a,b');
    await s.schedule.look();
    expect(s.placement.passes).toBe(1);
  });

  it('runs a pass at every look while the events are not heard, and once when they are heard again', async () => {
    const s = setup();
    s.setSince(undefined);
    await s.schedule.look();
    await s.schedule.look();
    expect(s.placement.passes).toBe(2);
    // Back, under a new since: what was said meanwhile went unheard.
    s.setSince(2);
    await s.schedule.look();
    expect(s.placement.passes).toBe(3);
    await s.schedule.look();
    expect(s.placement.passes).toBe(3);
  });

  it('runs a pass at every look after a pass that failed, or one that left work for time', async () => {
    const failed = setup({ outcome: undefined });
    failed.placement.outcome = undefined;
    await failed.schedule.look();
    expect(failed.placement.passes).toBe(1);
    const waiting = setup({ outcome: { online: 'a', settled: false, dueAt: null } });
    await waiting.schedule.look();
    await waiting.schedule.look();
    expect(waiting.placement.passes).toBe(2);
  });

  it('runs a pass once an awake model’s awake-until has passed, not before', async () => {
    const now = new Date(1_000_000);
    const outcome = passOutcome({
      now,
      online: ['a'],
      models: [{ awakeUntil: new Date(1_060_000) }, { awakeUntil: null }, { awakeUntil: new Date(900_000) }],
      replicas: [],
      settled: true,
    });
    expect(outcome.dueAt).toBe(1_060_000);
    const s = setup({ outcome });
    s.setNow(1_059_000);
    await s.schedule.look();
    expect(s.placement.passes).toBe(0);
    s.setNow(1_060_000);
    await s.schedule.look();
    expect(s.placement.passes).toBe(1);
  });

  it('is due when an ended replica is to be cleared away', () => {
    const now = new Date(1_000_000);
    const outcome = passOutcome({
      now,
      online: [],
      models: [],
      replicas: [
        { state: 'LOST', updatedAt: new Date(990_000) },
        { state: 'FAILED', updatedAt: new Date(500_000) },
        { state: 'READY', updatedAt: new Date(100_000) },
      ],
      settled: true,
    });
    expect(outcome.dueAt).toBe(990_000 + 10 * 60_000);
  });
});
