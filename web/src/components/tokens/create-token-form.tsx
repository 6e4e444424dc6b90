import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import type { Refusal, Role } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { CopyButton } from '../common/copy-button';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { RoleOptions } from '../common/role-options';
import { TokenTable_TokenFragment } from './token-table';

type Created = Answer<typeof CreateTokenForm_CreateMutation, 'createApiToken', 'CreatedApiToken'>;

/** The new token joins the cached `apiTokens` list through graphcache's updater (graphql/cache.ts). */
export const CreateTokenForm_CreateMutation = graphql(
  `
  mutation CreateTokenForm_Create($input: CreateApiTokenInput!) {
    createApiToken(input: $input) {
      __typename
      ... on CreatedApiToken {
        secret
        token {
          ...TokenTable_Token
        }
      }
      ...FormError_Refusal
    }
  }
`,
  [TokenTable_TokenFragment, FormError_RefusalFragment],
);

/** A date input's "YYYY-MM-DD" as the end of that day where the operator is: the token works through that day. */
export function endOfDay(date: string): string | null {
  if (!date) return null;
  const at = new Date(`${date}T23:59:59`);
  return Number.isNaN(at.getTime()) ? null : at.toISOString();
}

export function CreateTokenForm({ origin = window.location.origin }: { origin?: string }) {
  const [{ fetching, error }, create] = useMutation(CreateTokenForm_CreateMutation);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [created, setCreated] = useState<Created | null>(null);

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const formElement = event.currentTarget;
    const form = new FormData(formElement);
    setRefusal(null);
    setCreated(null);
    const result = await create({
      input: {
        name: String(form.get('name') ?? '').trim(),
        role: String(form.get('role')) as Role,
        expiresAt: endOfDay(String(form.get('expiresAt') ?? '')),
        callerOnly: form.get('callerOnly') === 'on',
      },
    });
    const outcome = result.data?.createApiToken;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'CreatedApiToken') {
      setCreated(outcome);
      formElement.reset();
    }
  };

  return (
    <section className="panel" aria-labelledby="create-token-title">
      <h2 id="create-token-title">Create a token</h2>
      {created ? <SecretOnce created={created} origin={origin} onDone={() => setCreated(null)} /> : null}
      <form className="form-row" onSubmit={submit}>
        <label className="field">
          <span>Token name</span>
          <input name="name" required placeholder="ci-deploy" autoComplete="off" />
        </label>
        <label className="field">
          <span>Role</span>
          <select name="role" defaultValue="VIEWER">
            <RoleOptions />
          </select>
        </label>
        <label className="field">
          <span>Expires</span>
          <input name="expiresAt" type="date" aria-describedby="expires-hint" />
        </label>
        <label className="check">
          <input name="callerOnly" type="checkbox" aria-describedby="caller-hint" />
          caller only (calls models at /v1, nothing else)
        </label>
        <button type="submit" className="button primary" disabled={fetching}>
          Create token
        </button>
      </form>
      <p id="expires-hint" className="hint">
        A token can hold at most your own role. Without an expiry date it works until it is revoked; with one, it stops
        at the end of that day.
      </p>
      <p id="caller-hint" className="hint">
        A caller token is for an application: it calls the models and adapters its user may call, with the OpenAI API at
        /v1, and is refused on GraphQL, /mirror and /api.
      </p>
      <FormError refusal={refusal} error={error} />
    </section>
  );
}

function SecretOnce({ created, origin, onDone }: { created: Created; origin: string; onDone: () => void }) {
  // A caller token is refused on /graphql: its example is the call it is for.
  const curl = created.token.callerOnly
    ? `curl -s ${origin}/v1/models -H 'Authorization: Bearer ${created.secret}'`
    : `curl -s ${origin}/graphql -H 'Authorization: Bearer ${created.secret}' -H 'Content-Type: application/json' -d '{"query":"{ viewer { user { email } role } }"}'`;
  return (
    <div className="secret-once" role="status">
      <p>
        <strong>Token “{created.token.name}” created.</strong> Copy its secret now: it will not be shown again (Hangar
        keeps only its hash).
      </p>
      <div className="secret-row">
        <code data-testid="token-secret" className="secret">
          {created.secret}
        </code>
        <CopyButton text={created.secret} label="Copy secret" />
      </div>
      <p className="hint">Scripts send it as a bearer token, for example:</p>
      <div className="secret-row">
        <pre className="code">
          <code data-testid="token-curl">{curl}</code>
        </pre>
        <CopyButton text={curl} label="Copy command" />
      </div>
      <button type="button" className="button small" onClick={onDone}>
        I have copied it
      </button>
    </div>
  );
}
