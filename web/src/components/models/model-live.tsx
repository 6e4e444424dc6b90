import { useEffect, useState } from 'react';
import { useQuery } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { DateTime } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { formatCount, formatDuration } from '../../lib/format';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { useClockTick } from '../common/time-ago';

export type ModelLive_Data = ResultOf<typeof ModelLive_UsageQuery>;
export type ModelLive_Model = NonNullable<ModelLive_Data['model']>;
type ModelLive_Usage = Extract<ModelLive_Data['usage'], { __typename: 'Usage' }>;
export type ModelLive_Point = ModelLive_Usage['points'][number];
export type ModelLive_Totals = ModelLive_Usage['totals'];

/**
 * Apart from the card's fragment: these numbers change every few seconds, and a mutation's answer (a mode change)
 * need not carry an hour of usage. The model's load fields land on the same cached Model by id.
 */
export const ModelLive_UsageQuery = graphql(
  `
  query ModelLive_Usage($name: String!, $from: DateTime!, $to: DateTime!) {
    model(name: $name) {
      id
      mode
      awakeUntil
      lastRequestAt
      idleSeconds
      waiting
      replicas {
        id
        state
        desired
        inFlight
        failing
        node {
          id
          name
        }
      }
    }
    usage(model: $name, from: $from, to: $to) {
      __typename
      ... on Usage {
        points {
          at
          requests
          errors
        }
        totals {
          requests
          errors
          aborted
          completionTokens
          tokensPerSecond
          p50Ms
          p95Ms
          meanTtftMs
        }
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/** Read again this often while the page is visible: requests are recorded in batches a few seconds apart. */
export const LIVE_REFRESH_MS = 30_000;
const HOUR_MS = 60 * 60_000;

/** The last hour, ending with the minute now under way, so the window moves a minute at a time. */
export function lastHour(now: number): { from: DateTime; to: DateTime } {
  const to = (Math.floor(now / 60_000) + 1) * 60_000;
  return { from: new Date(to - HOUR_MS).toISOString(), to: new Date(to).toISOString() };
}

/** A latency bound from the histogram: "≤ 250 ms", "≤ 2.5 s"; the last bucket also holds everything longer. */
export function latencyWords(ms: number | null): string {
  if (ms == null) return '—';
  if (ms >= 120_000) return '≥ 60 s';
  return ms < 1000 ? `≤ ${ms} ms` : `≤ ${ms / 1000} s`;
}

/** "last request 3 min ago · stops in 12 min", for an on-demand model; null for the other modes. */
export function idleWords(model: ModelLive_Model, now: number): string | null {
  if (model.mode !== 'ON_DEMAND') return null;
  const last = model.lastRequestAt ? new Date(model.lastRequestAt).getTime() : null;
  const lastWords = last == null ? 'no request yet' : `last request ${agoWords(now - last)}`;
  const running = model.replicas.some((r) => r.desired === 'RUN' && r.state !== 'STOPPED' && r.state !== 'FAILED');
  if (!running) return `${lastWords} · asleep: the next request wakes it`;
  // The gateway moves awakeUntil to the last request plus the idle time; before its first batch lands, the
  // last request alone says when.
  const stopAt = model.awakeUntil
    ? new Date(model.awakeUntil).getTime()
    : last != null
      ? last + model.idleSeconds * 1000
      : null;
  if (stopAt == null) return lastWords;
  if (stopAt <= now) return `${lastWords} · idle ${formatDuration(model.idleSeconds)}: stopping`;
  return `${lastWords} · stops in ${formatDuration((stopAt - now) / 1000)}`;
}

function agoWords(ms: number): string {
  return ms < 60_000 ? 'just now' : `${formatDuration(ms / 1000)} ago`;
}

/** The replicas the gateway sends to, with what it has in flight on each and why it routes around one. */
export function loadWords(model: ModelLive_Model): string[] {
  return model.replicas
    .filter((r) => r.state === 'READY' || r.failing)
    .map((r) => {
      const where = r.node?.name ?? `replica ${r.id.slice(0, 8)}`;
      return `${where}: ${r.inFlight} in flight${r.failing ? ` · failing: ${r.failing}` : ''}`;
    });
}

/**
 * The card's live line: the last hour's requests per minute (a bar per minute, errors in red), tokens per
 * second, p50/p95 latency and errors; for an on-demand model, when it last served and when it stops; and the
 * load on each replica this server's gateway sends to. `ownOnly`: the caller is a VIEWER, whom the server shows
 * their own requests alone, and the words say so rather than pass them off as the model's.
 */
export function ModelLive({ name, ownOnly = false }: { name: string; ownOnly?: boolean }) {
  const [now, setNow] = useState(() => Date.now());
  const [{ data, error }, refetch] = useQuery({ query: ModelLive_UsageQuery, variables: { name, ...lastHour(now) } });
  useClockTick();
  useEffect(() => {
    const t = setInterval(() => {
      if (document.visibilityState !== 'visible') return;
      const next = Date.now();
      // A new minute moves the window (new variables: urql reads it); within one, the same window is re-read.
      if (lastHour(next).to !== lastHour(now).to) setNow(next);
      else refetch({ requestPolicy: 'network-only' });
    }, LIVE_REFRESH_MS);
    return () => clearInterval(t);
  }, [now, refetch]);

  if (error) {
    return (
      // Not an alert: the card's own refusals are; this is a background read that the next refresh retries.
      <p className="model-live muted">Usage could not be read: {describeError(error)}</p>
    );
  }
  if (!data) return null;
  const usage = data.usage;
  const model = data.model;
  const idle = model ? idleWords(model, Date.now()) : null;
  const load = model ? loadWords(model) : [];
  return (
    <div className="model-live" data-testid="model-live">
      {isRefusal(usage) ? (
        <p className="form-error">{usage.message}</p>
      ) : usage.totals.requests === 0 ? (
        <p className="muted">{ownOnly ? 'None of your requests in the last hour.' : 'No requests in the last hour.'}</p>
      ) : (
        <div className="usage-line">
          <Sparkline points={usage.points} />
          <span data-testid="usage-words">{usageWords(usage.totals, ownOnly)}</span>
        </div>
      )}
      {idle ? (
        <p className="muted" data-testid="idle-words">
          {idle}
        </p>
      ) : null}
      {model && model.waiting > 0 ? (
        <p className="waiting">
          {model.waiting === 1 ? '1 request is' : `${model.waiting} requests are`} waiting for it to wake
        </p>
      ) : null}
      {load.length ? (
        <ul className="load-list" aria-label={`Load on ${name}`}>
          {load.map((l) => (
            <li key={l}>{l}</li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}

/** "Last hour: 42 requests · 0.7 a minute · 1.8 tok/s · p50 ≤ 250 ms · p95 ≤ 1 s · 2 errors · 1 aborted". */
export function usageWords(t: ModelLive_Totals, ownOnly = false): string {
  const parts = [
    `${ownOnly ? 'Your last hour' : 'Last hour'}: ${t.requests === 1 ? '1 request' : `${formatCount(t.requests)} requests`}`,
    `${(t.requests / 60).toFixed(1)} a minute`,
    `${t.tokensPerSecond.toFixed(1)} tok/s`,
    `p50 ${latencyWords(t.p50Ms)}`,
    `p95 ${latencyWords(t.p95Ms)}`,
    t.errors === 1 ? '1 error' : `${formatCount(t.errors)} errors`,
  ];
  if (t.aborted > 0) parts.push(`${formatCount(t.aborted)} aborted`);
  if (t.meanTtftMs != null) parts.push(`first token ${Math.round(t.meanTtftMs)} ms on average`);
  return parts.join(' · ');
}

const BAR = 3;

/** A bar per minute, scaled to the busiest one; a minute's errors drawn at its bar's foot. */
function Sparkline({ points }: { points: ModelLive_Point[] }) {
  const most = Math.max(1, ...points.map((p) => p.requests));
  const height = 24;
  const busiest = points.reduce((a, p) => Math.max(a, p.requests), 0);
  return (
    <svg
      className="sparkline"
      role="img"
      aria-label={`Requests per minute over the last hour, at most ${busiest} a minute`}
      width={points.length * BAR}
      height={height}
      viewBox={`0 0 ${points.length * BAR} ${height}`}
    >
      {points.map((p, i) => {
        const h = p.requests === 0 ? 0 : Math.max(1, (p.requests / most) * height);
        const e = p.errors === 0 ? 0 : Math.max(1, (p.errors / most) * height);
        return (
          <g key={p.at}>
            <title>{`${new Date(p.at).toISOString().slice(11, 16)} UTC: ${p.requests} requests, ${p.errors} errors`}</title>
            {h > 0 ? <rect className="bar" x={i * BAR} y={height - h} width={BAR - 1} height={h} /> : null}
            {e > 0 ? <rect className="bar-error" x={i * BAR} y={height - e} width={BAR - 1} height={e} /> : null}
          </g>
        );
      })}
    </svg>
  );
}
