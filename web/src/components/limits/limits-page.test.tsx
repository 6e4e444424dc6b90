import { render, screen, within } from '@testing-library/react';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { LimitsPage, LimitsPage_LimitsQuery } from './limits-page';

const limit = {
  __typename: 'Limit',
  id: 'l1',
  scope: 'team:acme/ml',
  scopeKey: 'team:00000000-0000-0000-0000-000000000001',
  model: null,
  declared: false,
  refused: 7,
  refusedBy: [
    { __typename: 'LimitRefuser', caller: 'key:nightly (ana@example.com)', count: 5 },
    { __typename: 'LimitRefuser', caller: 'user:ben@example.com', count: 2 },
  ],
  usage: [
    {
      __typename: 'LimitUsage',
      kind: 'requestsPerMinute',
      limit: 10,
      used: 10,
      remaining: 0,
      resetAt: new Date(Date.now() + 30_000).toISOString(),
    },
  ],
};

describe('LimitsPage', () => {
  it('names who each limit refused most in the last minute, beside how many it refused', async () => {
    const fake = fakeClient([
      answer(LimitsPage_LimitsQuery, () => ({ limits: { __typename: 'QueryLimitsSuccess', data: [limit] } })),
    ]);
    render(
      <Provider value={fake.client}>
        <LimitsPage viewer={{ role: 'OPERATOR' }} />
      </Provider>,
    );
    const list = await screen.findByRole('list', { name: 'Refused most in the last minute' });
    const items = within(list).getAllByTestId('refused-by');
    expect(items.map((i) => i.textContent)).toEqual(['key:nightly(ana@example.com) × 5', 'user:ben@example.com × 2']);
  });
});
