import { type FormEvent, useId, useState } from 'react';
import { graphql } from '../../graphql/graphql';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { useRefusableMutation } from '../common/use-refusable-mutation';

/** The model comes back with its id and new owner: graphcache updates every card showing it. */
export const ModelOwner_SetMutation = graphql(
  `
  mutation ModelOwner_Set($name: String!, $owner: String) {
    setModelOwner(name: $name, owner: $owner) {
      __typename
      ... on Model {
        id
        owner
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

export const OWNER_FORMS =
  'org:acme, team:acme/research, project:acme/research/chat, user:ana@example.com or key:<token id>';

/** Who a model's owner lets call it at /v1, in words: "every caller", or the owner as the server names it. */
export function ownerWords(owner: string | null): string {
  return owner ?? 'none: every caller';
}

/**
 * Restricts who may call a model at /v1 to the callers an owner admits, or makes it every caller's again. The
 * owner is typed in the forms the server reads; a refusal says which forms those are and what was not found.
 */
export function ModelOwnerForm({ model }: { model: { name: string; owner: string | null } }) {
  const [owner, setOwner] = useState('');
  const { fetching, error, refusal, run } = useRefusableMutation(ModelOwner_SetMutation, (d) => d.setModelOwner);
  const ownerId = useId();
  const hintId = useId();

  const send = async (next: string | null) => {
    if (await run({ name: model.name, owner: next })) setOwner('');
  };
  const submit = (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    // An empty field is not "public" by accident (Enter in a cleared field): the button for that says so.
    if (owner.trim() === '') return;
    void send(owner.trim());
  };

  return (
    <form className="mode-form owner-form" aria-label={`Owner of ${model.name}`} onSubmit={submit} noValidate>
      <div className="field">
        <label htmlFor={ownerId}>Owner</label>
        <input
          id={ownerId}
          className="owner-input"
          value={owner}
          placeholder="team:acme/research"
          autoComplete="off"
          spellCheck={false}
          aria-describedby={hintId}
          onChange={(e) => setOwner(e.target.value)}
        />
      </div>
      <button type="submit" className="button small" disabled={fetching || owner.trim() === ''}>
        Set owner
      </button>
      {model.owner ? (
        <button type="button" className="button small" disabled={fetching} onClick={() => void send(null)}>
          Make public
        </button>
      ) : null}
      <p id={hintId} className="hint">
        Only the callers an owner admits may call the model at /v1 (its members, or that user or key); to everyone else
        it does not exist. An owner is {OWNER_FORMS}.
      </p>
      <div className="mode-error">
        <FormError refusal={refusal} error={error} />
      </div>
    </form>
  );
}
