import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { Field } from '../common/field';
import { FormError, FormError_RefusalFragment } from '../common/form-error';

export const ChangePasswordForm_ChangeMutation = graphql(
  `
  mutation ChangePasswordForm_Change($input: ChangePasswordInput!) {
    changePassword(input: $input) {
      __typename
      ... on PasswordChanged {
        signedOut
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

export function ChangePasswordForm() {
  const [{ fetching, error }, change] = useMutation(ChangePasswordForm_ChangeMutation);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [mismatch, setMismatch] = useState<string>();
  const [done, setDone] = useState<number>();

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const formElement = event.currentTarget;
    const form = new FormData(formElement);
    const newPassword = String(form.get('newPassword') ?? '');
    setRefusal(null);
    setDone(undefined);
    // Checked here, not on the server: the server never sees the repeat, only what was typed twice the same.
    if (newPassword !== String(form.get('repeat') ?? '')) {
      setMismatch('the two new passwords differ: type the same one twice');
      return;
    }
    setMismatch(undefined);
    const result = await change({ input: { currentPassword: String(form.get('currentPassword') ?? ''), newPassword } });
    const outcome = result.data?.changePassword;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'PasswordChanged') {
      setDone(outcome.signedOut);
      formElement.reset();
    }
  };
  const fieldError = (field: string) => (refusal?.field === `input.${field}` ? refusal.message : undefined);

  return (
    <section className="panel" aria-labelledby="change-password-title">
      <h2 id="change-password-title">Change your password</h2>
      <form className="form-row" onSubmit={submit}>
        <Field
          label="Current password"
          name="currentPassword"
          type="password"
          required
          autoComplete="current-password"
          error={fieldError('currentPassword')}
        />
        <Field
          label="New password"
          name="newPassword"
          type="password"
          required
          minLength={12}
          autoComplete="new-password"
          hint="At least 12 characters."
          error={fieldError('newPassword')}
        />
        <Field
          label="New password again"
          name="repeat"
          type="password"
          required
          autoComplete="new-password"
          error={mismatch}
        />
        <button type="submit" className="button primary" disabled={fetching}>
          Change password
        </button>
      </form>
      <p className="hint">Your other sessions (other browsers, other machines) are signed out; this one stays.</p>
      <FormError refusal={refusal?.field?.startsWith('input.') ? null : refusal} error={error} />
      {done !== undefined ? (
        <p role="status" className="notice">
          Password changed.{' '}
          {done === 0
            ? 'No other session was open.'
            : `${done} other session${done === 1 ? ' was' : 's were'} signed out.`}
        </p>
      ) : null}
    </section>
  );
}
