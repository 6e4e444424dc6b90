import { type PointerEvent, useId, useState } from 'react';
import { type ChartPoint, chartPath, chartRange, nearestPoint, project } from './chart';

// The drawing box: the SVG stretches to its column (preserveAspectRatio none) and its strokes keep their width
// (non-scaling-stroke); the labels are HTML around it, so they stay the page's size at any width.
const W = 600;
const H = 160;

/**
 * One series as a line, with its axes' ends labelled: the y range at the left, the first and last step under it.
 * A reference (what the job asked for) is a dashed line, named in the legend.
 */
export function LineChart({
  title,
  points,
  formatY,
  zero = false,
  reference,
  second,
  empty,
}: {
  title: string;
  points: readonly ChartPoint[];
  formatY: (y: number) => string;
  zero?: boolean;
  reference?: { y: number; label: string };
  /** A second series on the same axes (the held-out loss beside the training loss), named in the legend. */
  second?: { points: readonly ChartPoint[]; label: string };
  /** Said in place of the chart while there is no point. */
  empty: string;
}) {
  const titleId = useId();
  const range = chartRange(points, {
    zero,
    include: [...(reference ? [reference.y] : []), ...(second?.points.map((p) => p.y) ?? [])],
  });
  const last = points.at(-1);
  // The point under the pointer, read out beside it: the step and its value, which the line alone cannot give.
  const [hovered, setHovered] = useState<ChartPoint | null>(null);
  const hover = (event: PointerEvent<SVGSVGElement>) => {
    if (!range) return;
    const box = event.currentTarget.getBoundingClientRect();
    setHovered(box.width > 0 ? nearestPoint(points, range, (event.clientX - box.left) / box.width) : null);
  };
  const at = hovered && range ? project(hovered, range, W, H) : null;
  return (
    <figure className="chart" aria-labelledby={titleId}>
      <figcaption id={titleId} className="chart-title">
        {title}
        {last ? (
          <span className="chart-last">
            {formatY(last.y)} <span className="muted">at step {last.x.toLocaleString('en')}</span>
          </span>
        ) : null}
      </figcaption>
      {range ? (
        <>
          <div className="chart-body">
            <div className="chart-y" aria-hidden="true">
              <span>{formatY(range.yMax)}</span>
              <span>{formatY(range.yMin)}</span>
            </div>
            <div className="chart-area">
              <svg
                className="chart-plot"
                viewBox={`0 0 ${W} ${H}`}
                preserveAspectRatio="none"
                onPointerMove={hover}
                onPointerLeave={() => setHovered(null)}
                role="img"
                aria-label={`${title}: ${points.length} steps, from ${formatY(points[0]?.y ?? 0)} at step ${points[0]?.x} to ${formatY(last?.y ?? 0)} at step ${last?.x}; lowest ${formatY(Math.min(...points.map((p) => p.y)))}, highest ${formatY(Math.max(...points.map((p) => p.y)))}`}
              >
                {reference ? (
                  <line
                    className="chart-reference"
                    x1={0}
                    x2={W}
                    y1={project({ x: 0, y: reference.y }, range, W, H).y}
                    y2={project({ x: 0, y: reference.y }, range, W, H).y}
                    vectorEffect="non-scaling-stroke"
                  />
                ) : null}
                <path className="chart-line" d={chartPath(points, range, W, H)} vectorEffect="non-scaling-stroke" />
                {second?.points.length ? (
                  <path
                    className="chart-line second"
                    d={chartPath(second.points, range, W, H)}
                    vectorEffect="non-scaling-stroke"
                  />
                ) : null}
                {at ? (
                  <line className="chart-cursor" x1={at.x} x2={at.x} y1={0} y2={H} vectorEffect="non-scaling-stroke" />
                ) : null}
              </svg>
              {hovered && at ? (
                <>
                  {/* HTML, not SVG: the plot is stretched to its box, and a circle in it would be an ellipse. */}
                  <span
                    className="chart-dot"
                    aria-hidden="true"
                    style={{ left: `${(at.x / W) * 100}%`, top: `${(at.y / H) * 100}%` }}
                  />
                  <span
                    className={`chart-tooltip${at.x > W * 0.6 ? ' left' : ''}`}
                    role="status"
                    style={{ left: `${(at.x / W) * 100}%`, top: `${(at.y / H) * 100}%` }}
                  >
                    <span className="muted">step {hovered.x.toLocaleString('en')}</span> {title.toLowerCase()}{' '}
                    <strong>{formatY(hovered.y)}</strong>
                  </span>
                </>
              ) : null}
            </div>
          </div>
          <div className="chart-x" aria-hidden="true">
            <span>step {range.xMin.toLocaleString('en')}</span>
            {reference ? (
              <span className="chart-legend">
                <span className="chart-dash" /> {reference.label}
              </span>
            ) : null}
            {second?.points.length ? (
              <span className="chart-legend">
                <span className="chart-swatch" /> {title.toLowerCase()} <span className="chart-swatch second" />{' '}
                {second.label} ({formatY(second.points.at(-1)?.y ?? 0)} at step{' '}
                {second.points.at(-1)?.x.toLocaleString('en')})
              </span>
            ) : null}
            <span>step {range.xMax.toLocaleString('en')}</span>
          </div>
        </>
      ) : (
        <p className="chart-empty muted">{empty}</p>
      )}
    </figure>
  );
}
