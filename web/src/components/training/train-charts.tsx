import { useEffect, useRef } from 'react';
import { gql, useQuery } from 'urql';
import { formatMiB } from '../../lib/format';
import { describeError } from '../common/form-error';
import { LineChart } from './line-chart';
import { formatLoss } from './train-progress';

export type TrainCharts_Metric = {
  step: number;
  loss: number;
  lr: number | null;
  peakMiB: number | null;
  tokensPerSecond: number | null;
};

/** A learning rate as it is written: 0.00014, 2e-7, 0 at the end of a cosine schedule. */
export function formatRate(lr: number): string {
  return String(Number(lr.toPrecision(3)));
}

/** The curve, every step reported; read again when the job's step moves (the job's events do not carry it). */
export const TrainCharts_MetricsQuery = gql<
  { trainJob: { __typename?: 'TrainJob'; id: string; metrics: TrainCharts_Metric[] } | null },
  { id: string }
>`
  query TrainCharts_Metrics($id: ID!) {
    trainJob(id: $id) {
      id
      metrics {
        step
        loss
        lr
        peakMiB
        tokensPerSecond
      }
    }
  }
`;

/**
 * The loss and peak-memory curves of one job. `step` is the job's step as its live events say: when it moves, the
 * metrics are read again, one read at a time, so a trainer reporting every 150 ms costs a read per answer, not
 * one per step.
 */
export function TrainCharts({ id, step, gpuMiB }: { id: string; step: number; gpuMiB: number }) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: TrainCharts_MetricsQuery,
    variables: { id },
    requestPolicy: 'cache-and-network',
  });
  const readAt = useRef(step);
  useEffect(() => {
    if (fetching || step === readAt.current) return;
    readAt.current = step;
    refetch({ requestPolicy: 'network-only' });
  }, [step, fetching, refetch]);

  const metrics = data?.trainJob?.metrics ?? [];
  const loss = metrics.map((m) => ({ x: m.step, y: m.loss }));
  const peak = metrics.flatMap((m) => (m.peakMiB == null ? [] : [{ x: m.step, y: m.peakMiB }]));
  const last = metrics.at(-1);
  return (
    <section className="train-charts" aria-label="Curves">
      {error ? (
        <p role="alert" className="form-error">
          {describeError(error)}
        </p>
      ) : null}
      <div className="chart-grid">
        <LineChart
          title="Loss"
          points={loss}
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
