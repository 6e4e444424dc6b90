import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import type { Role } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { Breakable } from '../common/breakable';
import { ACTIONS_COLUMN, DataTable } from '../common/data-table';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { InlineProblem, LabelledControl, SubmitButton } from '../common/form-parts';
import { RoleOptions } from '../common/role-options';
import { TimeAgo } from '../common/time-ago';

export type UserTable_User = ResultOf<typeof UserTable_UserFragment>;

export const UserTable_UserFragment = graphql(`
  fragment UserTable_User on User {
    id
    email
    name
    role
    disabled
    createdAt
  }
`);

/** The result is the user: graphcache updates the row by id. */
export const UserRow_UpdateMutation = graphql(
  `
  mutation UserRow_Update($id: ID!, $input: UpdateUserInput!) {
    updateUser(id: $id, input: $input) {
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

export function UserTable({ users, viewerId }: { users: UserTable_User[]; viewerId: string }) {
  const sorted = [...users].sort((a, b) => a.email.localeCompare(b.email));
  return (
    <DataTable className="users" columns={['Email', 'Name', 'Role', 'State', 'Created', ACTIONS_COLUMN]}>
      <tbody>
        {sorted.map((u) => (
          <UserRow key={u.id} user={u} isYou={u.id === viewerId} />
        ))}
      </tbody>
    </DataTable>
  );
}

function UserRow({ user, isYou }: { user: UserTable_User; isYou: boolean }) {
  const [{ fetching }, update] = useMutation(UserRow_UpdateMutation);
  const [problem, setProblem] = useState<string>();
  const [resetting, setResetting] = useState(false);
  const [notice, setNotice] = useState<string>();
  const change = async (input: { role?: Role; disabled?: boolean; password?: string }) => {
    setProblem(undefined);
    setNotice(undefined);
    const result = await update({ id: user.id, input });
    const outcome = result.data?.updateUser;
    if (isRefusal(outcome)) setProblem(outcome.message);
    else if (result.error) setProblem(describeError(result.error));
    return outcome?.__typename === 'User';
  };
  const reset = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const password = String(new FormData(event.currentTarget).get('password') ?? '');
    if (await change({ password })) {
      setResetting(false);
      setNotice(
        isYou
          ? 'Password set; your sessions were signed out.'
          : `Password reset: ${user.email} was signed out everywhere. Tell them the new one another way.`,
      );
    }
  };
  return (
    <>
      <tr className={user.disabled ? 'dimmed' : undefined}>
        <th scope="row" className="identifier">
          <Breakable text={user.email} />
          {isYou ? <span className="muted"> (you)</span> : null}
        </th>
        <td>{user.name}</td>
        <td>
          <select
            aria-label={`Role of ${user.email}`}
            value={user.role}
            disabled={fetching}
            onChange={(e) => change({ role: e.target.value as Role })}
          >
            <RoleOptions />
          </select>
        </td>
        <td>
          <span className={`badge ${user.disabled ? 'muted' : 'ok'}`}>{user.disabled ? 'disabled' : 'active'}</span>
        </td>
        <td>
          <TimeAgo at={user.createdAt} />
        </td>
        <td className="actions stack">
          <button
            type="button"
            className="button small"
            disabled={fetching}
            aria-expanded={resetting}
            onClick={() => setResetting((r) => !r)}
          >
            Reset password
          </button>
          <button
            type="button"
            className={`button small${user.disabled ? '' : ' danger'}`}
            disabled={fetching}
            onClick={() => change({ disabled: !user.disabled })}
          >
            {user.disabled ? 'Enable' : 'Disable'}
          </button>
          <InlineProblem problem={problem} />
        </td>
      </tr>
      {notice && !resetting ? (
        <tr className="row-detail">
          <td colSpan={6}>
            <p role="status" className="notice">
              {notice}
            </p>
          </td>
        </tr>
      ) : null}
      {resetting ? (
        <tr className="row-detail">
          <td colSpan={6}>
            <form className="form-row" onSubmit={reset} aria-label={`Reset the password of ${user.email}`}>
              <LabelledControl label={`New password for ${user.email}`}>
                <input name="password" type="password" required minLength={12} autoComplete="new-password" />
              </LabelledControl>
              <SubmitButton busy={fetching}>Set password</SubmitButton>
              <button type="button" className="button" onClick={() => setResetting(false)}>
                Cancel
              </button>
            </form>
            <p className="hint">
              At least 12 characters. Every session of {isYou ? 'yours, this one included,' : 'theirs'} ends, and live
              views opened with them close.
            </p>
          </td>
        </tr>
      ) : null}
    </>
  );
}
