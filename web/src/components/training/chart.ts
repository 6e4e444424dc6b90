// The arithmetic of the training charts, apart from their drawing so it can be tested: which range each axis
// shows, and the SVG path of the points in a box of the given size.

export type ChartPoint = { x: number; y: number };

export type ChartRange = { xMin: number; xMax: number; yMin: number; yMax: number };

/**
 * The range the axes show: the points' own, so a loss that moves between 1.9 and 2.1 fills the chart rather than
 * lying flat at the top. `zero` starts the y axis at 0 (memory: a bar from nothing reads truer than a zoomed one);
 * `include` widens it to show a reference line (the GPU memory the job asked for). A flat series gets a little
 * room above and below, so its line sits in the middle instead of on an edge. Null without points.
 */
export function chartRange(
  points: readonly ChartPoint[],
  { zero = false, include = [] }: { zero?: boolean; include?: readonly number[] } = {},
): ChartRange | null {
  if (points.length === 0) return null;
  let xMin = Number.POSITIVE_INFINITY;
  let xMax = Number.NEGATIVE_INFINITY;
  let yMin = zero ? 0 : Number.POSITIVE_INFINITY;
  let yMax = Number.NEGATIVE_INFINITY;
  for (const p of points) {
    xMin = Math.min(xMin, p.x);
    xMax = Math.max(xMax, p.x);
    yMin = Math.min(yMin, p.y);
    yMax = Math.max(yMax, p.y);
  }
  for (const y of include) {
    yMin = Math.min(yMin, y);
    yMax = Math.max(yMax, y);
  }
  if (yMin === yMax) {
    const room = Math.abs(yMax) * 0.1 || 1;
    yMax += room;
    if (!(zero && yMin === 0)) yMin -= room;
  }
  return { xMin, xMax, yMin, yMax };
}

/** Where a value lands in the box: x from the left edge, y from the top (SVG's y grows downwards). */
export function project(p: ChartPoint, range: ChartRange, width: number, height: number): ChartPoint {
  const x = range.xMax === range.xMin ? width / 2 : ((p.x - range.xMin) / (range.xMax - range.xMin)) * width;
  const y = height - ((p.y - range.yMin) / (range.yMax - range.yMin)) * height;
  return { x: round(x), y: round(y) };
}

/** The points as one SVG path ("M0 80L12.5 64…"), in order; a single point is a dot-sized stroke. */
export function chartPath(points: readonly ChartPoint[], range: ChartRange, width: number, height: number): string {
  const at = points.map((p) => project(p, range, width, height));
  if (at.length === 1 && at[0]) return `M${at[0].x} ${at[0].y}h0.01`;
  return at.map((p, i) => `${i === 0 ? 'M' : 'L'}${p.x} ${p.y}`).join('');
}

/**
 * The point nearest to where the pointer is, as a fraction (0 at the left edge, 1 at the right) of the x range:
 * what a hover over the chart reads out. Points are in step order; null without points.
 */
export function nearestPoint(points: readonly ChartPoint[], range: ChartRange, fraction: number): ChartPoint | null {
  if (points.length === 0) return null;
  const x = range.xMin + Math.min(Math.max(fraction, 0), 1) * (range.xMax - range.xMin);
  let lo = 0;
  let hi = points.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((points[mid]?.x ?? 0) < x) lo = mid + 1;
    else hi = mid;
  }
  const after = points[lo];
  const before = points[lo - 1];
  if (!after) return null;
  return before && x - before.x <= after.x - x ? before : after;
}

const round = (n: number) => Math.round(n * 100) / 100;
