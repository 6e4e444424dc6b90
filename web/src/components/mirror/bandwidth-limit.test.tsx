import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { BandwidthLimit, BandwidthLimit_Query, BandwidthLimit_SetMutation } from './bandwidth-limit';

describe('BandwidthLimit', () => {
  it('shows the limit, sets one in MB/s, shows a refusal, and lifts it', async () => {
    const server = { limit: null as number | null };
    const fake = fakeClient([
      answer(BandwidthLimit_Query, () => ({ mirror: { __typename: 'Mirror', bandwidthLimit: server.limit } })),
      answer(BandwidthLimit_SetMutation, ({ bytesPerSecond }) => {
        if (bytesPerSecond != null && bytesPerSecond < 65_536) {
          return {
            setMirrorBandwidth: {
              __typename: 'ValidationError',
              code: 'VALIDATION',
              field: 'bytesPerSecond',
              message: 'bytesPerSecond: at least 65536 (64 KiB/s), or 0 for no limit',
            },
          };
        }
        server.limit = bytesPerSecond ?? null;
        return { setMirrorBandwidth: { __typename: 'MirrorBandwidth', bytesPerSecond } };
      }),
    ]);
    render(
      <Provider value={fake.client}>
        <BandwidthLimit canChange />
      </Provider>,
    );
    const user = userEvent.setup();
    expect(await screen.findByText('none')).toBeInTheDocument();

    await user.click(screen.getByRole('button', { name: 'Change' }));
    await user.type(screen.getByLabelText('MB/s'), '0.01');
    await user.click(screen.getByRole('button', { name: 'Set' }));
    expect(await screen.findByRole('alert')).toHaveTextContent('at least 65536');

    await user.clear(screen.getByLabelText('MB/s'));
    await user.type(screen.getByLabelText('MB/s'), '50');
    await user.click(screen.getByRole('button', { name: 'Set' }));
    expect(await screen.findByText('50 MB/s')).toBeInTheDocument();
    expect(fake.sent(BandwidthLimit_SetMutation).at(-1)?.variables).toEqual({ bytesPerSecond: 50_000_000 });

    await user.click(screen.getByRole('button', { name: 'Change' }));
    await user.click(screen.getByRole('button', { name: 'No limit' }));
    expect(await screen.findByText('none')).toBeInTheDocument();
  }, 20_000);

  it('offers a viewer no way to change it', async () => {
    const fake = fakeClient([
      answer(BandwidthLimit_Query, () => ({ mirror: { __typename: 'Mirror', bandwidthLimit: 2_000_000 } })),
    ]);
    render(
      <Provider value={fake.client}>
        <BandwidthLimit canChange={false} />
      </Provider>,
    );
    expect(await screen.findByText('2 MB/s')).toBeInTheDocument();
    expect(screen.queryByRole('button')).toBeNull();
  });
});
