// Small pieces both of the agent's downloaders use (the model cache, and the training worker's data and base
// weights), beside what every download in Hangar shares (lib/download: the download itself, its backoff and
// sleep): one copy, so a fix to one reaches the other.

/** Aborts when any of the given signals does; the undefined ones are left out. */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  return AbortSignal.any(signals.filter((s): s is AbortSignal => Boolean(s)));
}
