import { render, screen } from '@testing-library/react';
import { describe, expect, it } from 'vitest';
import { AwakeUntil } from './model-card';

// The header of a model card said "stopped · awake until in 14 minutes" after a day of mode changes: the timer
// means something only for an on-demand model, and only while it runs.
describe('AwakeUntil', () => {
  const later = new Date(Date.now() + 14 * 60_000).toISOString();

  it('shows an on-demand model’s timer while it runs', () => {
    render(<AwakeUntil mode="ON_DEMAND" awakeUntil={later} ready />);
    expect(screen.getByTestId('awake-until')).toHaveTextContent(/^awake until in 1[34] minutes$/);
  });

  it('shows nothing for a stopped or always-on model, nor for a timer that ran out', () => {
    const { rerender } = render(<AwakeUntil mode="STOPPED" awakeUntil={later} ready />);
    expect(screen.queryByTestId('awake-until')).toBeNull();
    rerender(<AwakeUntil mode="ALWAYS" awakeUntil={later} ready />);
    expect(screen.queryByTestId('awake-until')).toBeNull();
    rerender(<AwakeUntil mode="ON_DEMAND" awakeUntil={new Date(Date.now() - 60_000).toISOString()} ready />);
    expect(screen.queryByTestId('awake-until')).toBeNull();
  });

  it('says nothing of being awake while no replica is ready (it said "awake until" over a failed wake)', () => {
    render(<AwakeUntil mode="ON_DEMAND" awakeUntil={later} ready={false} />);
    expect(screen.queryByTestId('awake-until')).toBeNull();
  });
});
