// The autoscaler's rule for one model, as a pure step over one sample: the loop (scaling-loop.ts) reads the load
// every server's gateway publishes, calls this, and writes what it returns. A replica is added when the load per
// READY replica has stayed above the target for the whole window, and removed when it has stayed low enough for the
// window that the replicas left would still be at or under the target: removing one that the load then needs back
// would only start a cold replica a window later, and the callers would wait for it twice.

export type Trend = 'up' | 'down';

export type ScaleState = {
  /** The replica count the autoscaler chose (placement keeps it within min and max). */
  replicas: number;
  trend: Trend | null;
  trendSince: Date | null;
  /** Sum and count of the per-replica samples since trendSince: their average goes in the reason. */
  trendSum: number;
  trendSamples: number;
};

export type ScaleModel = {
  name: string;
  minReplicas: number;
  maxReplicas: number;
  targetInFlight: number;
  /** An on-demand model (min 0) that a request woke: it keeps one replica at least while awake. */
  awake: boolean;
};

export type ScaleSample = {
  /** Requests in flight at its replicas, over every server, and those waiting for one (the wake queue). */
  load: number;
  /** Its READY replicas, not draining. */
  ready: number;
};

export type ScaleDecision = { direction: Trend; from: number; to: number; message: string };

/** The fewest replicas the model runs now: its min, or one while an on-demand model is awake, or none. */
export function floorOf(m: Pick<ScaleModel, 'minReplicas' | 'maxReplicas' | 'awake'>): number {
  if (m.maxReplicas === 0) return 0;
  return m.minReplicas > 0 ? m.minReplicas : m.awake ? 1 : 0;
}

const rest = (): Omit<ScaleState, 'replicas'> => ({
  trend: null,
  trendSince: null,
  trendSum: 0,
  trendSamples: 0,
});

export function initialState(m: ScaleModel): ScaleState {
  return { replicas: floorOf(m), ...rest() };
}

/** One sample: the state to keep and, when the window has run out on one side, the decision. */
export function scaleStep(
  m: ScaleModel,
  before: ScaleState,
  sample: ScaleSample,
  now: Date,
  windowMs: number,
): { state: ScaleState; decision?: ScaleDecision } {
  const floor = floorOf(m);
  // Asleep or stopped: nothing to scale; a wake starts again from one.
  if (floor === 0) return { state: { replicas: 0, ...rest() } };
  const current = Math.min(m.maxReplicas, Math.max(floor, before.replicas));
  // Until one is READY, the load has no replica to be averaged over: it counts as on one.
  const perReplica = sample.load / Math.max(1, sample.ready);
  let side: Trend | null = null;
  // A replica added is not counted as capacity until it is READY: more would be added while it loads.
  if (perReplica > m.targetInFlight && current < m.maxReplicas && sample.ready >= current) side = 'up';
  else if (current > floor && sample.load / (current - 1) <= m.targetInFlight) side = 'down';
  if (!side) return { state: { replicas: current, ...rest() } };
  const same = before.trend === side && before.trendSince !== null;
  const state: ScaleState = {
    replicas: current,
    trend: side,
    trendSince: same ? before.trendSince : now,
    trendSum: (same ? before.trendSum : 0) + perReplica,
    trendSamples: (same ? before.trendSamples : 0) + 1,
  };
  const heldMs = now.getTime() - (state.trendSince as Date).getTime();
  if (heldMs < windowMs) return { state };
  const to = side === 'up' ? current + 1 : current - 1;
  const average = state.trendSum / state.trendSamples;
  const message = `${round(average)} in flight per replica for ${round(heldMs / 1000)} s, target ${round(m.targetInFlight)}: ${current} → ${to}`;
  // The next step waits a whole window again: the new count must show what it does to the load first.
  return { state: { replicas: to, ...rest() }, decision: { direction: side, from: current, to, message } };
}

function round(n: number): string {
  return String(Math.round(n * 10) / 10);
}
