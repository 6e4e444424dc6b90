import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { graphql } from '../../graphql/graphql';
import type { Refusal, Role } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { RoleOptions } from '../common/role-options';
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
  const [{ fetching, error }, create] = useMutation(CreateUserForm_CreateMutation);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [createdEmail, setCreatedEmail] = useState<string>();

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const formElement = event.currentTarget;
    const form = new FormData(formElement);
    setRefusal(null);
    setCreatedEmail(undefined);
    const result = await create({
      input: {
        email: String(form.get('email') ?? '').trim(),
        name: String(form.get('name') ?? '').trim(),
        role: String(form.get('role')) as Role,
        password: String(form.get('password') ?? ''),
      },
    });
    const outcome = result.data?.createUser;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'User') {
      setCreatedEmail(outcome.email);
      formElement.reset();
    }
  };

  return (
    <section className="panel" aria-labelledby="create-user-title">
      <h2 id="create-user-title">Create a user</h2>
      <form className="form-row" onSubmit={submit}>
        <label className="field">
          <span>Email</span>
          <input name="email" type="email" required autoComplete="off" />
        </label>
        <label className="field">
          <span>Name</span>
          <input name="name" required autoComplete="off" />
        </label>
        <label className="field">
          <span>Role</span>
          <select name="role" defaultValue="VIEWER">
            <RoleOptions />
          </select>
        </label>
        <label className="field">
          <span>Password</span>
          <input name="password" type="password" required autoComplete="new-password" aria-describedby="pw-hint" />
        </label>
        <button type="submit" className="button primary" disabled={fetching}>
          Create user
        </button>
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
    </section>
  );
}
