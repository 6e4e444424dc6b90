import { render, screen, within } from '@testing-library/react';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { usageWords } from './token-table';
import { lastDay, TokensPage, TokensPage_TokensQuery, TokensPage_UsageQuery } from './tokens-page';

const token = (id: string, name: string) => ({
  __typename: 'ApiToken',
  id,
  name,
  prefix: `hgr_${id}`,
  role: 'VIEWER',
  callerOnly: false,
  batch: false,
  limits: [],
  createdAt: '2026-01-01T00:00:00.000Z',
  expiresAt: null,
  lastUsedAt: null,
  revokedAt: null,
  active: true,
});

const totals = (requests: number, errors: number, promptTokens: number, completionTokens: number) => ({
  __typename: 'UsageTotals',
  requests,
  errors,
  promptTokens,
  completionTokens,
});

describe('the Tokens page’s usage', () => {
  it('shows what each token used in the last 24 hours, all tokens read in one request', async () => {
    const fake = fakeClient([
      answer(TokensPage_TokensQuery, () => ({ apiTokens: [token('t1', 'nightly-sync'), token('t2', 'ci-deploy')] })),
      answer(TokensPage_UsageQuery, () => ({
        apiTokens: [
          { __typename: 'ApiToken', id: 't1', usage: totals(1204, 3, 2_500_000, 1_100_000) },
          { __typename: 'ApiToken', id: 't2', usage: totals(0, 0, 0, 0) },
        ],
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <TokensPage />
      </Provider>,
    );
    const row = (name: string) => screen.findByRole('rowheader', { name }).then((h) => h.closest('tr') as HTMLElement);
    const nightly = within(await row('nightly-sync'));
    expect(await nightly.findByText('1.2K requests · 3.6M tokens · 3 errors')).toHaveAttribute(
      'title',
      '2,500,000 prompt + 1,100,000 completion tokens',
    );
    expect(within(await row('ci-deploy')).getByTestId('token-usage')).toHaveTextContent('no requests');
    expect(screen.getByRole('columnheader', { name: 'Last 24 h' })).toBeInTheDocument();
    // One operation for every row (the same one, however often urql hands it on), never one per token.
    const sent = fake.sent(TokensPage_UsageQuery);
    expect(new Set(sent.map((op) => op.key)).size).toBe(1);
    expect(
      fake.operations.every((op) => op.kind !== 'query' || /TokensPage_/.test(String(op.query.loc?.source.body))),
    ).toBe(true);
    const { from, to } = sent[0]?.variables ?? { from: '', to: '' };
    expect(new Date(to).getTime() - new Date(from).getTime()).toBe(24 * 60 * 60_000);
  });

  it('says a token’s usage in words', () => {
    expect(usageWords({ requests: 1, errors: 0, promptTokens: 12, completionTokens: 30 })).toBe(
      '1 request · 42 tokens',
    );
    expect(usageWords({ requests: 0, errors: 0, promptTokens: 0, completionTokens: 0 })).toBe('no requests');
    expect(lastDay(Date.parse('2026-12-01T12:30:20Z'))).toEqual({
      from: '2026-11-30T12:31:00.000Z',
      to: '2026-12-01T12:31:00.000Z',
    });
  });
});
