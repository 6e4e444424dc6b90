import { useState } from 'react';
import { graphql } from '../../graphql/graphql';
import { Field } from '../common/field';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, onFormSubmit, SubmitButton } from '../common/form-parts';
import { useRefusableMutation } from '../common/use-refusable-mutation';

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
  const { fetching, error, refusal, run, clearRefusal } = useRefusableMutation(
    ChangePasswordForm_ChangeMutation,
    (d) => d.changePassword,
  );
  const [mismatch, setMismatch] = useState<string>();
  const [done, setDone] = useState<number>();

  const submit = onFormSubmit(async (values, form) => {
    const newPassword = String(values.get('newPassword') ?? '');
    clearRefusal();
    setDone(undefined);
    // Checked here, not on the server: the server never sees the repeat, only what was typed twice the same.
    if (newPassword !== String(values.get('repeat') ?? '')) {
      setMismatch('the two new passwords differ: type the same one twice');
      return;
    }
    setMismatch(undefined);
    const outcome = await run({
      input: { currentPassword: String(values.get('currentPassword') ?? ''), newPassword },
    });
    if (outcome?.__typename === 'PasswordChanged') {
      setDone(outcome.signedOut);
      form.reset();
    }
  });
  const fieldError = (field: string) => (refusal?.field === `input.${field}` ? refusal.message : undefined);

  return (
    <FormPanel titleId="change-password-title" title="Change your password">
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
        <SubmitButton busy={fetching}>Change password</SubmitButton>
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
    </FormPanel>
  );
}
