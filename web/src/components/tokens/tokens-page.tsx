import { gql, useQuery } from 'urql';
import { describeError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { CreateTokenForm } from './create-token-form';
import { TokenTable, type TokenTable_Token, TokenTable_TokenFragment } from './token-table';

export const TokensPage_TokensQuery = gql<{ apiTokens: TokenTable_Token[] }>`
  query TokensPage_Tokens {
    apiTokens {
      ...TokenTable_Token
    }
  }
  ${TokenTable_TokenFragment}
`;

export function TokensPage() {
  const [{ data, fetching, error }] = useQuery({ query: TokensPage_TokensQuery });
  return (
    <section>
      <PageHeader title="Tokens">
        Your API tokens, for scripts and GraphQL clients. A secret is shown once, when it is created.
      </PageHeader>
      {error ? (
        <p role="alert" className="form-error">
          {describeError(error)}
        </p>
      ) : null}
      {data ? <TokenTable tokens={data.apiTokens} /> : fetching ? <p className="muted">Loading…</p> : null}
      <CreateTokenForm />
    </section>
  );
}
