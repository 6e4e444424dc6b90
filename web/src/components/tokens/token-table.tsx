import { useState } from 'react';
import { useMutation } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { formatCount } from '../../lib/format';
import { ACTIONS_COLUMN, DataTable } from '../common/data-table';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { InlineProblem } from '../common/form-parts';
import { TimeAgo } from '../common/time-ago';
import { LimitsLeft } from '../limits/limits-left';
import type { TokensPage_UsageQuery } from './tokens-page';

export type TokenTable_Token = ResultOf<typeof TokenTable_TokenFragment>;

export const TokenTable_TokenFragment = graphql(`
  fragment TokenTable_Token on ApiToken {
    id
    name
    prefix
    role
    callerOnly
    batch
    limits {
      id
      model
      usage { kind limit remaining }
    }
    createdAt
    expiresAt
    lastUsedAt
    revokedAt
    active
  }
`);

/** The result is the token itself: graphcache updates its row (active, revokedAt) by id. */
export const TokenRow_RevokeMutation = graphql(
  `
  mutation TokenRow_Revoke($id: ID!) {
    revokeApiToken(id: $id) {
      __typename
      ... on ApiToken {
        ...TokenTable_Token
      }
      ...FormError_Refusal
    }
  }
`,
  [TokenTable_TokenFragment, FormError_RefusalFragment],
);

/** Marks a token batch or interactive again (its owner or an admin); graphcache updates its row by id. */
export const TokenRow_SetBatchMutation = graphql(
  `
  mutation TokenRow_SetBatch($id: ID!, $batch: Boolean!) {
    setTokenBatch(id: $id, batch: $batch) {
      __typename
      ... on ApiToken {
        ...TokenTable_Token
      }
      ...FormError_Refusal
    }
  }
`,
  [TokenTable_TokenFragment, FormError_RefusalFragment],
);

/** What a token was used for over the Tokens page's range (the last 24 hours). */
export type TokenUsage = Extract<
  ResultOf<typeof TokensPage_UsageQuery>['apiTokens'][number]['usage'],
  { __typename: 'UsageTotals' }
>;

/** "12 requests · 3.4K tokens · 1 error"; the prompt and completion split goes in a title. */
export function usageWords(u: Omit<TokenUsage, '__typename'>): string {
  if (u.requests === 0) return 'no requests';
  const parts = [
    u.requests === 1 ? '1 request' : `${formatCount(u.requests)} requests`,
    `${formatCount(u.promptTokens + u.completionTokens)} tokens`,
  ];
  if (u.errors > 0) parts.push(u.errors === 1 ? '1 error' : `${formatCount(u.errors)} errors`);
  return parts.join(' · ');
}

export function tokenState(token: TokenTable_Token): 'active' | 'revoked' | 'expired' {
  if (token.revokedAt) return 'revoked';
  return token.active ? 'active' : 'expired';
}

export function TokenTable({
  tokens,
  usage,
}: {
  tokens: TokenTable_Token[];
  /** Each token's last 24 hours, by id; a token not in it yet shows a dash. */
  usage?: ReadonlyMap<string, TokenUsage | Refusal>;
}) {
  if (tokens.length === 0) {
    return <p className="empty">No API tokens yet. Create one below for a script or a CI job.</p>;
  }
  return (
    <DataTable
      className="stack-narrow tokens"
      columns={['Name', 'Prefix', 'Role', 'Created', 'Expires', 'Last used', 'Last 24 h', 'State', ACTIONS_COLUMN]}
    >
      <tbody>
        {tokens.map((t) => (
          <TokenRow key={t.id} token={t} usage={usage?.get(t.id)} />
        ))}
      </tbody>
    </DataTable>
  );
}

const stateClass = { active: 'ok', revoked: 'muted', expired: 'warn' } as const;

function TokenRow({ token, usage }: { token: TokenTable_Token; usage: TokenUsage | Refusal | undefined }) {
  const [{ fetching }, revoke] = useMutation(TokenRow_RevokeMutation);
  const [{ fetching: marking }, setBatch] = useMutation(TokenRow_SetBatchMutation);
  const [problem, setProblem] = useState<string>();
  const onBatch = async () => {
    setProblem(undefined);
    const result = await setBatch({ id: token.id, batch: !token.batch });
    const outcome = result.data?.setTokenBatch;
    if (isRefusal(outcome)) setProblem(outcome.message);
    else if (result.error) setProblem(describeError(result.error));
  };
  const state = tokenState(token);
  const onRevoke = async () => {
    setProblem(undefined);
    const result = await revoke({ id: token.id });
    const outcome = result.data?.revokeApiToken;
    if (isRefusal(outcome)) setProblem(outcome.message);
    else if (result.error) setProblem(describeError(result.error));
  };
  return (
    <tr>
      <th scope="row">
        {token.name}
        {token.callerOnly ? (
          <>
            {' '}
            <span className="badge muted" title="Calls models at /v1; refused on GraphQL, /mirror and /api">
              caller
            </span>
          </>
        ) : null}
        {token.batch ? (
          <>
            {' '}
            <span
              className="badge muted"
              title="Waits behind interactive requests; refused first when a budget runs low"
            >
              batch
            </span>
          </>
        ) : null}
        <TokenLimits limits={token.limits} />
      </th>
      <td className="mono" data-label="Prefix">
        {token.prefix}…
      </td>
      <td data-label="Role">{token.role}</td>
      <td data-label="Created">
        <TimeAgo at={token.createdAt} />
      </td>
      <td data-label="Expires">
        <TimeAgo at={token.expiresAt} empty="never" />
      </td>
      <td data-label="Last used">
        <TimeAgo at={token.lastUsedAt} empty="never" />
      </td>
      <td className="token-usage" data-testid="token-usage" data-label="Last 24 h">
        {usage == null ? (
          <span className="muted">—</span>
        ) : 'message' in usage ? (
          <span className="form-error inline">{usage.message}</span>
        ) : (
          <span
            className={usage.requests === 0 ? 'muted' : undefined}
            title={`${usage.promptTokens.toLocaleString('en')} prompt + ${usage.completionTokens.toLocaleString('en')} completion tokens`}
          >
            {usageWords(usage)}
          </span>
        )}
      </td>
      <td data-label="State">
        <span className={`badge ${stateClass[state]}`}>{state}</span>
      </td>
      <td className="actions">
        {state === 'active' ? (
          // One or the other, in the width of one button: the table holds nine columns at 1280 px.
          <div className="token-actions">
            <button
              type="button"
              className="button small"
              onClick={onBatch}
              disabled={marking}
              title={
                token.batch
                  ? 'Its requests stop waiting behind interactive ones'
                  : 'Its requests wait behind interactive ones, and are the first refused when a budget runs low'
              }
            >
              {token.batch ? 'Mark interactive' : 'Mark batch'}
            </button>
            <button type="button" className="button small danger" onClick={onRevoke} disabled={fetching}>
              Revoke
            </button>
          </div>
        ) : null}
        <InlineProblem problem={problem} />
      </td>
    </tr>
  );
}

/** The token's own limits (the Limits page has every scope's): what is left of each, on one muted line. */
function TokenLimits({ limits }: { limits: TokenTable_Token['limits'] }) {
  return <LimitsLeft limits={limits} testId="token-limits" />;
}
