import { describe, expect, it } from 'vitest';
import { chartPath, chartRange, nearestPoint, project } from './chart';

const pts = (...ys: number[]) => ys.map((y, i) => ({ x: i + 1, y }));

describe('chartRange', () => {
  it('spans the points, so a curve that moves a little fills the chart', () => {
    expect(chartRange(pts(2.1, 1.95, 1.9))).toEqual({ xMin: 1, xMax: 3, yMin: 1.9, yMax: 2.1 });
    expect(chartRange([])).toBeNull();
  });

  it('starts at zero when asked, and widens to show a reference line', () => {
    expect(chartRange(pts(3000, 3500), { zero: true })).toEqual({ xMin: 1, xMax: 2, yMin: 0, yMax: 3500 });
    expect(chartRange(pts(3000, 3500), { zero: true, include: [8192] })?.yMax).toBe(8192);
  });

  it('gives a flat series room above and below, so its line is not drawn on an edge', () => {
    expect(chartRange(pts(2, 2))).toEqual({ xMin: 1, xMax: 2, yMin: 1.8, yMax: 2.2 });
    expect(chartRange(pts(0, 0))).toEqual({ xMin: 1, xMax: 2, yMin: -1, yMax: 1 });
    // From zero, nothing goes below it.
    expect(chartRange(pts(0), { zero: true })).toEqual({ xMin: 1, xMax: 1, yMin: 0, yMax: 1 });
  });
});

describe('chartPath', () => {
  it('maps the first step to the left edge, the last to the right, the highest value to the top', () => {
    const range = { xMin: 1, xMax: 3, yMin: 0, yMax: 4 };
    expect(chartPath(pts(4, 2, 0), range, 100, 40)).toBe('M0 0L50 20L100 40');
  });

  it('draws one point in the middle, as a dot', () => {
    const points = pts(5);
    const range = chartRange(points);
    expect(range).not.toBeNull();
    if (range) expect(chartPath(points, range, 100, 40)).toBe('M50 20h0.01');
  });

  it('rounds to hundredths, which is finer than any screen', () => {
    expect(project({ x: 1, y: 1 }, { xMin: 0, xMax: 3, yMin: 0, yMax: 3 }, 100, 100)).toEqual({ x: 33.33, y: 66.67 });
  });
});

describe('nearestPoint', () => {
  const points = [
    { x: 1, y: 2.5 },
    { x: 2, y: 2.1 },
    { x: 5, y: 1.7 },
    { x: 11, y: 1.2 },
  ];
  const range = { xMin: 1, xMax: 11, yMin: 1.2, yMax: 2.5 };
  it('reads the step nearest to the pointer, with the edges held to the first and last', () => {
    expect(nearestPoint(points, range, 0)).toEqual({ x: 1, y: 2.5 });
    expect(nearestPoint(points, range, 0.12)).toEqual({ x: 2, y: 2.1 });
    expect(nearestPoint(points, range, 0.35)).toEqual({ x: 5, y: 1.7 });
    expect(nearestPoint(points, range, 0.75)).toEqual({ x: 11, y: 1.2 });
    expect(nearestPoint(points, range, 1.5)).toEqual({ x: 11, y: 1.2 });
    expect(nearestPoint(points, range, -1)).toEqual({ x: 1, y: 2.5 });
    expect(nearestPoint([], range, 0.5)).toBeNull();
  });
});
