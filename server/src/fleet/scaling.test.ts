import { describe, expect, it } from 'vitest';
import { wanted } from './placement.js';
import { initialState, type ScaleModel, type ScaleState, scaleStep } from './scaling.js';

// The autoscaler's rule, sample by sample: up only after the whole window above the target, down only after the
// whole window low enough that the replicas left stay at or under it, never under min (or one while an on-demand
// model is awake) nor over max, and each decision said with its reason.

const WINDOW = 60_000;
const model = (o: Partial<ScaleModel> = {}): ScaleModel => ({
  name: 'tiny',
  minReplicas: 1,
  maxReplicas: 3,
  targetInFlight: 2,
  awake: false,
  ...o,
});
const at = (s: number) => new Date(Date.UTC(2026, 11, 7, 12, 0, s));

/** Samples every 5 s from `from` to `to` seconds with the same load, returning the last result's decision too. */
function run(m: ScaleModel, state: ScaleState, load: number, ready: number, from: number, to: number) {
  const decisions = [];
  for (let s = from; s <= to; s += 5) {
    const step = scaleStep(m, state, { load, ready }, at(s), WINDOW);
    state = step.state;
    if (step.decision) decisions.push({ at: s, ...step.decision });
  }
  return { state, decisions };
}

describe('scaleStep', () => {
  it('adds a replica once the load stayed above the target for the whole window, saying why', () => {
    const m = model();
    const early = run(m, initialState(m), 3.4, 1, 0, 55);
    expect(early.decisions).toEqual([]);
    const { decisions, state } = run(m, early.state, 3.4, 1, 60, 60);
    expect(decisions).toEqual([
      { at: 60, direction: 'up', from: 1, to: 2, message: '3.4 in flight per replica for 60 s, target 2: 1 → 2' },
    ]);
    expect(state.replicas).toBe(2);
    expect(state.trend).toBeNull();
  });

  it('starts the window again when the load dips under the target midway', () => {
    const m = model();
    let { state } = run(m, initialState(m), 5, 1, 0, 40);
    ({ state } = run(m, state, 1, 1, 45, 45));
    const { decisions } = run(m, state, 5, 1, 50, 105);
    expect(decisions).toEqual([]);
  });

  it('adds none while an added replica is still loading, and never goes over max', () => {
    const m = model({ maxReplicas: 2 });
    const loading = run(m, { ...initialState(m), replicas: 2 }, 9, 1, 0, 120);
    expect(loading.decisions).toEqual([]);
    const atMax = run(m, { ...initialState(m), replicas: 2 }, 9, 2, 0, 300);
    expect(atMax.decisions).toEqual([]);
    expect(atMax.state.replicas).toBe(2);
  });

  it('removes one only when those left would stay at or under the target, and never under min', () => {
    const m = model({ minReplicas: 1, maxReplicas: 3 });
    // 5 in flight over 3: 1.7 each, but 2.5 each over 2: kept.
    expect(run(m, { ...initialState(m), replicas: 3 }, 5, 3, 0, 300).decisions).toEqual([]);
    const down = run(m, { ...initialState(m), replicas: 3 }, 1, 3, 0, 60);
    expect(down.decisions.map((d) => d.message)).toEqual(['0.3 in flight per replica for 60 s, target 2: 3 → 2']);
    const floor = run(m, { ...initialState(m), replicas: 1 }, 0, 1, 0, 600);
    expect(floor.decisions).toEqual([]);
    expect(floor.state.replicas).toBe(1);
  });

  it('keeps one replica of an awake on-demand model, and none once it sleeps', () => {
    const awake = model({ minReplicas: 0, awake: true });
    const idle = run(awake, { ...initialState(awake), replicas: 2 }, 0, 2, 0, 120);
    expect(idle.decisions.map((d) => d.to)).toEqual([1]);
    expect(idle.state.replicas).toBe(1);
    const asleep = model({ minReplicas: 0, awake: false });
    expect(run(asleep, { ...initialState(asleep), replicas: 2 }, 0, 0, 0, 10).state.replicas).toBe(0);
  });
});

describe('wanted with a scaled count', () => {
  const now = at(0);
  it('takes the autoscaler’s count within min (or awake) and max, and nothing while asleep or stopped', () => {
    expect(wanted({ minReplicas: 1, maxReplicas: 3, awakeUntil: null, scaledReplicas: 2 }, now)).toBe(2);
    expect(wanted({ minReplicas: 1, maxReplicas: 3, awakeUntil: null, scaledReplicas: 9 }, now)).toBe(3);
    expect(wanted({ minReplicas: 2, maxReplicas: 3, awakeUntil: null, scaledReplicas: 1 }, now)).toBe(2);
    expect(wanted({ minReplicas: 0, maxReplicas: 3, awakeUntil: null, scaledReplicas: 3 }, now)).toBe(0);
    expect(wanted({ minReplicas: 0, maxReplicas: 3, awakeUntil: at(60), scaledReplicas: 3 }, now)).toBe(3);
    expect(wanted({ minReplicas: 0, maxReplicas: 0, awakeUntil: at(60), scaledReplicas: 3 }, now)).toBe(0);
    expect(wanted({ minReplicas: 2, maxReplicas: 2, awakeUntil: null }, now)).toBe(2);
  });
});
