import { useMemo, useState } from 'react';
import { useQuery } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { DateTime, Refusal, Role } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { PageHeader } from '../common/page';
import { CreateTokenForm } from './create-token-form';
import { TokenTable, TokenTable_TokenFragment, type TokenUsage } from './token-table';

export const TokensPage_TokensQuery = graphql(
  `
  query TokensPage_Tokens {
    apiTokens {
      ...TokenTable_Token
    }
  }
`,
  [TokenTable_TokenFragment],
);

/**
 * Every token's last 24 hours in one request (ApiToken.usage, read in one SQL query for all rows), next to the
 * list rather than in it: a token just created joins the list at once (graphcache's updater), and only this query
 * is read again for its (empty) usage; and the list's query needs no range that changes from minute to minute.
 */
export const TokensPage_UsageQuery = graphql(
  `
  query TokensPage_Usage($from: DateTime!, $to: DateTime!) {
    apiTokens {
      id
      usage(from: $from, to: $to) {
        __typename
        ... on UsageTotals {
          requests
          errors
          promptTokens
          completionTokens
        }
        ...FormError_Refusal
      }
    }
  }
`,
  [FormError_RefusalFragment],
);

const DAY_MS = 24 * 60 * 60_000;

/** The last 24 hours up to the end of the minute under way: usage is kept per minute. */
export function lastDay(now: number): { from: DateTime; to: DateTime } {
  const to = (Math.floor(now / 60_000) + 1) * 60_000;
  return { from: new Date(to - DAY_MS).toISOString(), to: new Date(to).toISOString() };
}

export function TokensPage({ viewer }: { viewer?: { role: Role } } = {}) {
  const [{ data, fetching, error }] = useQuery({ query: TokensPage_TokensQuery });
  // Read once per visit: a day's totals move slowly, and a reload reads them again.
  const [range] = useState(() => lastDay(Date.now()));
  // Asked with the list, side by side: one round trip's wait for both.
  const [usageResult] = useQuery({ query: TokensPage_UsageQuery, variables: range });
  const usage = useMemo(() => {
    const byId = new Map<string, TokenUsage | Refusal>();
    for (const t of usageResult.data?.apiTokens ?? []) byId.set(t.id, t.usage);
    return byId;
  }, [usageResult.data]);
  return (
    <section>
      <PageHeader title="Tokens">
        Your API tokens, for scripts and GraphQL clients. A secret is shown once, when it is created.
      </PageHeader>
      <FormError error={error} />
      {data ? (
        <TokenTable tokens={data.apiTokens} usage={usage} />
      ) : fetching ? (
        <p className="muted">Loading…</p>
      ) : null}
      <CreateTokenForm viewerRole={viewer?.role} />
    </section>
  );
}
