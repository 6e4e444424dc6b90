import type { CatalogModel } from '../generated/prisma/client.js';

// A catalog model's mode (always, on demand, stopped) and what it means in words: shared by the service, the
// schema and the audit log.

export type Mode = 'ALWAYS' | 'ON_DEMAND' | 'STOPPED';

/** (measured − estimated) / estimated, or null until both are known. */
export function memoryEstimateError(m: Pick<CatalogModel, 'memoryBytes' | 'measuredMemoryBytes'>): number | null {
  if (!m.memoryBytes || m.measuredMemoryBytes == null) return null;
  const estimated = Number(m.memoryBytes);
  return Math.round(((Number(m.measuredMemoryBytes) - estimated) / estimated) * 10_000) / 10_000;
}

export function modeOf(m: Pick<CatalogModel, 'minReplicas' | 'maxReplicas'>): Mode {
  return m.maxReplicas === 0 ? 'STOPPED' : m.minReplicas === 0 ? 'ON_DEMAND' : 'ALWAYS';
}

/** 900 → "15 minutes": the idle time as an operator reads it. */
export function durationWords(seconds: number): string {
  const plural = (n: number, unit: string) => `${n} ${unit}${n === 1 ? '' : 's'}`;
  if (seconds % 3600 === 0 && seconds >= 3600) return plural(seconds / 3600, 'hour');
  if (seconds % 60 === 0 && seconds >= 60) return plural(seconds / 60, 'minute');
  return plural(seconds, 'second');
}

/**
 * What the model's mode means now, in words: what happens next after a change, and what holds once it has.
 * "stopped" alone would not say that its replicas are still going, nor "on demand" when it will stop again.
 */
export function modeMessage(
  m: Pick<CatalogModel, 'minReplicas' | 'maxReplicas' | 'idleSeconds'>,
  replicas: readonly { state: string; desired: string }[],
): string {
  const running = replicas.filter((r) => ['PENDING', 'LOADING', 'READY'].includes(r.state));
  const replicaWord = (n: number) => `${n} replica${n === 1 ? '' : 's'}`;
  switch (modeOf(m)) {
    case 'STOPPED':
      return running.length
        ? `stopped; its replicas are being taken down (${running.length} still running)`
        : 'stopped: no replica runs; set it to always or on demand to serve it';
    case 'ON_DEMAND': {
      const idle = durationWords(m.idleSeconds);
      const up = running.some((r) => r.desired === 'RUN');
      return up
        ? `on demand: running now; stops after ${idle} unused, and starts again when a request asks for it`
        : `on demand: starts when a request asks for it, stops after ${idle} unused`;
    }
    default: {
      const wanted = replicas.filter((r) => r.desired === 'RUN');
      const ready = wanted.filter((r) => r.state === 'READY').length;
      const arriving = wanted.filter((r) => r.state === 'PENDING' || r.state === 'LOADING').length;
      const failed = wanted.filter((r) => r.state === 'FAILED').length;
      if (ready >= m.minReplicas)
        return `always: ${replicaWord(m.minReplicas)} ${m.minReplicas === 1 ? 'runs' : 'run'}`;
      // "being placed" over a replica that failed would promise what is not happening: say it failed.
      if (failed && !arriving)
        return `always: ${replicaWord(m.minReplicas)} wanted, ${ready} ready; ${failed} failed (each replica says why)`;
      return `always: ${replicaWord(m.minReplicas)} ${m.minReplicas === 1 ? 'is' : 'are'} being placed${ready ? ` (${ready} ready)` : ''}`;
    }
  }
}

/** always = min ≥ 1 (that many replicas); on demand = min 0, max ≥ 1; stopped = max 0. */
export function scaling(mode: Mode, replicas: number) {
  if (mode === 'STOPPED') return { minReplicas: 0, maxReplicas: 0 };
  if (mode === 'ON_DEMAND') return { minReplicas: 0, maxReplicas: Math.max(1, replicas) };
  return { minReplicas: Math.max(1, replicas), maxReplicas: Math.max(1, replicas) };
}
