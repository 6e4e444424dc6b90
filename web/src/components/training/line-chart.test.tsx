import { fireEvent, render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import { LineChart } from './line-chart';

describe('LineChart', () => {
  it('shows the step and value under the pointer, and nothing once it leaves', () => {
    const points = [
      { x: 1, y: 2.512 },
      { x: 2, y: 2.104 },
      { x: 3, y: 1.733 },
    ];
    render(<LineChart title="Loss" points={points} formatY={(y) => y.toFixed(3)} empty="none" />);
    const plot = screen.getByRole('img', { name: /^Loss/ });
    // jsdom lays nothing out: the plot's box is given, 300 px wide.
    plot.getBoundingClientRect = () => ({ left: 100, width: 300, top: 0, height: 160 }) as DOMRect;
    expect(screen.queryByRole('status')).toBeNull();
    fireEvent.pointerMove(plot, { clientX: 260 });
    expect(screen.getByRole('status')).toHaveTextContent('step 2 loss 2.104');
    fireEvent.pointerMove(plot, { clientX: 399 });
    expect(screen.getByRole('status')).toHaveTextContent('step 3 loss 1.733');
    fireEvent.pointerLeave(plot);
    expect(screen.queryByRole('status')).toBeNull();
  });
});
