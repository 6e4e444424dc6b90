import { useState } from 'react';
import { type Answer, graphql } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { CopyButton } from '../common/copy-button';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { RoleField } from '../common/role-options';
import { useRefusableMutation } from '../common/use-refusable-mutation';
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

export function CreateTokenForm({
  origin = window.location.origin,
  viewerRole,
}: {
  origin?: string;
  /** The signed-in person's role: a token holds at most it, so only it and those below are offered. */
  viewerRole?: Role;
}) {
  const { fetching, error, refusal, run } = useRefusableMutation(
    CreateTokenForm_CreateMutation,
    (d) => d.createApiToken,
  );
  const [created, setCreated] = useState<Created | null>(null);

  const submit = onFormSubmit(async (values, form) => {
    setCreated(null);
    const outcome = await run({
      input: {
        name: String(values.get('name') ?? '').trim(),
        role: String(values.get('role')) as Role,
        expiresAt: endOfDay(String(values.get('expiresAt') ?? '')),
        callerOnly: values.get('callerOnly') === 'on',
        batch: values.get('batch') === 'on',
      },
    });
    if (outcome?.__typename === 'CreatedApiToken') {
      setCreated(outcome);
      form.reset();
    }
  });

  return (
    <FormPanel titleId="create-token-title" title="Create a token">
      {created ? <SecretOnce created={created} origin={origin} onDone={() => setCreated(null)} /> : null}
      <form className="form-row" onSubmit={submit}>
        <LabelledControl label="Token name">
          <input name="name" required placeholder="ci-deploy" autoComplete="off" />
        </LabelledControl>
        <RoleField upTo={viewerRole} />
        <LabelledControl label="Expires">
          <input name="expiresAt" type="date" aria-describedby="expires-hint" />
        </LabelledControl>
        <label className="check">
          <input name="callerOnly" type="checkbox" aria-describedby="caller-hint" />
          caller only (calls models at /v1, nothing else)
        </label>
        <label className="check">
          <input name="batch" type="checkbox" aria-describedby="batch-hint" />
          batch (waits behind interactive requests)
        </label>
        <SubmitButton busy={fetching}>Create token</SubmitButton>
      </form>
      <p id="expires-hint" className="hint">
        A token can hold at most your own role. Without an expiry date it works until it is revoked; with one, it stops
        at the end of that day.
      </p>
      <p id="caller-hint" className="hint">
        A caller token is for an application: it calls the models and adapters its user may call, with the OpenAI API at
        /v1, and is refused on GraphQL, /mirror and /api.
      </p>
      <p id="batch-hint" className="hint">
        A batch token is for a job that can wait (a nightly evaluation): its requests go to a replica only when no
        interactive request wants it, and are the first refused when a budget runs low. A token can be marked batch or
        interactive later on its row.
      </p>
      <FormError refusal={refusal} error={error} />
    </FormPanel>
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
