import { useId } from 'react';
import { type ChartPoint, chartPath, chartRange } from '../training/chart';

// What calls and idle GPU time cost over time, two lines on one axis from zero: the training charts' drawing
// (chart.ts, the same classes), with dates under it instead of steps.
const W = 600;
const H = 160;

export function CostChart({
  points,
  currency,
}: {
  points: readonly { at: string; cost: string; idleCost: string }[];
  currency: string;
}) {
  const titleId = useId();
  const calls: ChartPoint[] = points.map((p) => ({ x: Date.parse(p.at), y: Number(p.cost) }));
  const idle: ChartPoint[] = points.map((p) => ({ x: Date.parse(p.at), y: Number(p.idleCost) }));
  const range = chartRange(calls, { zero: true, include: idle.map((p) => p.y) });
  const money = (y: number) => `${y.toFixed(2)} ${currency}`;
  const when = (x: number) =>
    new Date(x).toLocaleString('en', {
      month: 'short',
      day: 'numeric',
      hour: '2-digit',
      minute: '2-digit',
      hour12: false,
    });
  const sum = (ps: ChartPoint[]) => ps.reduce((s, p) => s + p.y, 0);
  return (
    <figure className="chart cost-chart" aria-labelledby={titleId}>
      <figcaption id={titleId} className="chart-title">
        Cost over time
        <span className="chart-last">
          calls {money(sum(calls))} <span className="muted">· idle {money(sum(idle))}</span>
        </span>
      </figcaption>
      {range ? (
        <>
          <div className="chart-body">
            <div className="chart-y" aria-hidden="true">
              <span>{money(range.yMax)}</span>
              <span>{money(range.yMin)}</span>
            </div>
            <div className="chart-area">
              <svg
                className="chart-plot"
                viewBox={`0 0 ${W} ${H}`}
                preserveAspectRatio="none"
                role="img"
                aria-label={`Cost per step: calls ${money(sum(calls))}, idle ${money(sum(idle))}, over ${points.length} steps`}
              >
                <path className="chart-line" d={chartPath(calls, range, W, H)} vectorEffect="non-scaling-stroke" />
                <path
                  className="chart-line second"
                  d={chartPath(idle, range, W, H)}
                  vectorEffect="non-scaling-stroke"
                />
              </svg>
            </div>
          </div>
          <div className="chart-x" aria-hidden="true">
            <span>{when(range.xMin)}</span>
            <span className="chart-legend">
              <span className="chart-swatch" /> calls <span className="chart-swatch second" /> idle
            </span>
            <span>{when(range.xMax)}</span>
          </div>
        </>
      ) : (
        <p className="chart-empty muted">Nothing in this range.</p>
      )}
    </figure>
  );
}
