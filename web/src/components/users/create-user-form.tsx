import { useState } from 'react';
import { graphql } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { FormPanel, LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { RoleField } from '../common/role-options';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { UserTable_UserFragment } from './user-table';

/** The user joins the cached `users` list through graphcache's updater (graphql/cache.ts). */
export const CreateUserForm_CreateMutation = graphql(
  `
  mutation CreateUserForm_Create($input: CreateUserInput!) {
    createUser(input: $input) {
      __typename
      ... on User {
        ...UserTable_User
      }
      ...FormError_Refusal
    }
  }
`,
  [UserTable_UserFragment, FormError_RefusalFragment],
);

export function CreateUserForm() {
  const { fetching, error, refusal, run } = useRefusableMutation(CreateUserForm_CreateMutation, (d) => d.createUser);
  const [createdEmail, setCreatedEmail] = useState<string>();

  const submit = onFormSubmit(async (values, form) => {
    setCreatedEmail(undefined);
    const outcome = await run({
      input: {
        email: String(values.get('email') ?? '').trim(),
        name: String(values.get('name') ?? '').trim(),
        role: String(values.get('role')) as Role,
        password: String(values.get('password') ?? ''),
      },
    });
    if (outcome?.__typename === 'User') {
      setCreatedEmail(outcome.email);
      form.reset();
    }
  });

  return (
    <FormPanel titleId="create-user-title" title="Create a user">
      <form className="form-row" onSubmit={submit}>
        <LabelledControl label="Email">
          <input name="email" type="email" required autoComplete="off" />
        </LabelledControl>
        <LabelledControl label="Name">
          <input name="name" required autoComplete="off" />
        </LabelledControl>
        <RoleField />
        <LabelledControl label="Password">
          <input name="password" type="password" required autoComplete="new-password" aria-describedby="pw-hint" />
        </LabelledControl>
        <SubmitButton busy={fetching}>Create user</SubmitButton>
      </form>
      <p id="pw-hint" className="hint">
        At least 12 characters. Tell the person their password another way; they can sign in at once.
      </p>
      <FormError refusal={refusal} error={error} />
      {createdEmail ? (
        <p role="status" className="notice">
          Created {createdEmail}.
        </p>
      ) : null}
    </FormPanel>
  );
}
