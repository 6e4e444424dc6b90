import { useEffect, useRef, useState } from 'react';
import { useQuery, useSubscription } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { formatMiB } from '../../lib/format';
import { FormError } from '../common/form-error';
import { LineChart } from './line-chart';
import { formatLoss } from './train-progress';

export const TrainCharts_MetricFragment = graphql(`
  fragment TrainCharts_Metric on TrainMetric {
    step
    loss
    lr
    peakMiB
    tokensPerSecond
    evalLoss
  }
`);

export type TrainCharts_Metric = ResultOf<typeof TrainCharts_MetricFragment>;

/** A learning rate as it is written: 0.00014, 2e-7, 0 at the end of a cosine schedule. */
export function formatRate(lr: number): string {
  return String(Number(lr.toPrecision(3)));
}

/** The curve, every step reported (the server's newest 5000), read once; live events add the points after it. */
export const TrainCharts_MetricsQuery = graphql(
  `
  query TrainCharts_Metrics($id: ID!) {
    trainJob(id: $id) {
      id
      metrics {
        ...TrainCharts_Metric
      }
    }
  }
`,
  [TrainCharts_MetricFragment],
);

/** How many of the newest points each live event carries: more than a trainer reports between two events. */
export const POINTS_PER_EVENT = 64;
// As many points as the server's curve holds: a chart that appends for hours keeps the newest, like a fresh read.
const MOST_POINTS = 5000;

/**
 * Each change of the job with its newest points: the chart appends those after its last step instead of reading
 * the whole curve (up to 5000 rows) again on every step. The server reads them once per event for every watcher.
 */
export const TrainCharts_PointsSubscription = graphql(
  `
  subscription TrainCharts_Points($id: ID!, $last: Int!) {
    trainJobChanged(id: $id) {
      id
      metrics(last: $last) {
        ...TrainCharts_Metric
      }
    }
  }
`,
  [TrainCharts_MetricFragment],
);

/**
 * The curve after an event: the points of `newest` after the curve's last step appended, or null when they do not
 * join it (more points arrived than an event carries, or the curve was reset): then the whole curve is read again.
 */
export function appendPoints(curve: TrainCharts_Metric[], newest: TrainCharts_Metric[]): TrainCharts_Metric[] | null {
  const lastStep = curve.at(-1)?.step ?? Number.NEGATIVE_INFINITY;
  const after = newest.filter((m) => m.step > lastStep);
  if (after.length === 0) return curve;
  // A full batch that starts after the curve's end may have left points out between the two.
  const joins = newest.length < POINTS_PER_EVENT || newest.some((m) => m.step <= lastStep);
  if (!joins) return null;
  const joined = curve.concat(after);
  return joined.length > MOST_POINTS ? joined.slice(joined.length - MOST_POINTS) : joined;
}

/**
 * The loss and peak-memory curves of one job: read once, then followed by the job's live events, which carry the
 * newest points.
 */
export function TrainCharts({ id, gpuMiB }: { id: string; gpuMiB: number }) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: TrainCharts_MetricsQuery,
    variables: { id },
    requestPolicy: 'cache-and-network',
  });
  const [{ data: event }] = useSubscription({
    query: TrainCharts_PointsSubscription,
    variables: { id, last: POINTS_PER_EVENT },
  });
  const read = data?.trainJob?.metrics;
  // The points appended since the last read, kept with the read they follow: a new read starts them again.
  const [appended, setAppended] = useState<{ read?: TrainCharts_Metric[]; curve: TrainCharts_Metric[] }>({
    curve: [],
  });
  const metrics = appended.read === read && read ? appended.curve : (read ?? []);
  const current = useRef(metrics);
  current.current = metrics;
  useEffect(() => {
    const newest = event?.trainJobChanged?.metrics;
    if (!newest || !read) return;
    const next = appendPoints(current.current, newest);
    if (next === null) refetch({ requestPolicy: 'network-only' });
    else if (next !== current.current) setAppended({ read, curve: next });
  }, [event, read, refetch]);

  const loss = metrics.map((m) => ({ x: m.step, y: m.loss }));
  // The loss on the held-out pairs, where the trainer evaluated: rising while the training loss falls is over-fitting.
  const heldOut = metrics.flatMap((m) => (m.evalLoss == null ? [] : [{ x: m.step, y: m.evalLoss }]));
  const peak = metrics.flatMap((m) => (m.peakMiB == null ? [] : [{ x: m.step, y: m.peakMiB }]));
  const last = metrics.at(-1);
  return (
    <section className="train-charts" aria-label="Curves">
      <FormError error={error} />
      <div className="chart-grid">
        <LineChart
          title="Loss"
          points={loss}
          second={{ points: heldOut, label: 'held-out loss' }}
          formatY={formatLoss}
          empty={fetching && !data ? 'Reading the curve…' : 'No step reported yet: the curve starts with the first.'}
        />
        <LineChart
          title="Peak GPU memory"
          points={peak}
          formatY={formatMiB}
          zero
          reference={{ y: gpuMiB, label: `asked for ${formatMiB(gpuMiB)}` }}
          empty={fetching && !data ? 'Reading the curve…' : 'The trainer has not reported its memory yet.'}
        />
      </div>
      {last ? (
        <p className="hint">
          At step {last.step.toLocaleString('en')}:{' '}
          {[
            last.lr != null ? `learning rate ${formatRate(last.lr)}` : null,
            last.tokensPerSecond != null ? `${last.tokensPerSecond.toFixed(0)} tokens/s` : null,
          ]
            .filter(Boolean)
            .join(' · ') || 'no learning rate or speed reported'}
        </p>
      ) : null}
    </section>
  );
}
