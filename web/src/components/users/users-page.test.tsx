import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { CreateUserForm_CreateMutation } from './create-user-form';
import { UserRow_UpdateMutation } from './user-table';
import { UsersPage, UsersPage_UsersQuery } from './users-page';

const admin = {
  __typename: 'User',
  id: 'u1',
  email: 'admin@example.com',
  name: 'Admin',
  role: 'ADMIN',
  disabled: false,
  createdAt: '2026-01-01T00:00:00.000Z',
};
const pat = { ...admin, id: 'u2', email: 'pat@example.com', name: 'Pat', role: 'VIEWER' };

function setup() {
  const stored = { ...pat };
  const fake = fakeClient([
    answer(UsersPage_UsersQuery, () => ({ users: [admin, pat] })),
    answer(UserRow_UpdateMutation, ({ id, input }) => {
      if (id === 'u1') {
        return {
          updateUser: { __typename: 'ForbiddenError', message: 'you cannot demote yourself', code: 'FORBIDDEN' },
        };
      }
      const { password: _, ...change } = input;
      Object.assign(stored, change);
      return { updateUser: { ...stored } };
    }),
    answer(CreateUserForm_CreateMutation, ({ input: { password: _, ...input } }) => ({
      createUser: { ...pat, id: 'u3', ...input },
    })),
  ]);
  render(
    <Provider value={fake.client}>
      <UsersPage viewer={{ id: 'u1', role: 'ADMIN' }} />
    </Provider>,
  );
  return fake;
}

const rowOf = async (email: string) =>
  (await screen.findByRole('rowheader', { name: new RegExp(email) })).closest('tr') as HTMLElement;

describe('UsersPage', () => {
  it('changes a role and disables a user, row by row', async () => {
    const fake = setup();
    const user = userEvent.setup();
    const row = await rowOf('pat@example.com');

    await user.selectOptions(within(row).getByRole('combobox', { name: 'Role of pat@example.com' }), 'OPERATOR');
    await user.click(within(row).getByRole('button', { name: 'Disable' }));

    expect(await within(row).findByRole('button', { name: 'Enable' })).toBeInTheDocument();
    expect(within(row).getByText('disabled')).toBeInTheDocument();
    expect(within(row).getByRole('combobox', { name: 'Role of pat@example.com' })).toHaveValue('OPERATOR');
    expect(fake.sent(UserRow_UpdateMutation).map((op) => op.variables)).toEqual([
      { id: 'u2', input: { role: 'OPERATOR' } },
      { id: 'u2', input: { disabled: true } },
    ]);
  });

  it("resets a user's password from their row, and says what that did", async () => {
    const fake = setup();
    const user = userEvent.setup();
    const row = await rowOf('pat@example.com');
    await user.click(within(row).getByRole('button', { name: 'Reset password' }));
    const form = screen.getByRole('form', { name: 'Reset the password of pat@example.com' });
    await user.type(within(form).getByLabelText('New password for pat@example.com'), 'a fresh long password');
    await user.click(within(form).getByRole('button', { name: 'Set password' }));
    expect(await screen.findByRole('status')).toHaveTextContent(
      'Password reset: pat@example.com was signed out everywhere',
    );
    expect(screen.queryByRole('form', { name: /Reset the password/ })).toBeNull();
    expect(fake.sent(UserRow_UpdateMutation).map((op) => op.variables)).toEqual([
      { id: 'u2', input: { password: 'a fresh long password' } },
    ]);
  });

  it('shows a refusal in the row it is about', async () => {
    setup();
    const user = userEvent.setup();
    const row = await rowOf('admin@example.com');
    await user.selectOptions(within(row).getByRole('combobox', { name: 'Role of admin@example.com' }), 'VIEWER');
    expect(await within(row).findByRole('alert')).toHaveTextContent('you cannot demote yourself');
    expect(within(row).getByRole('combobox', { name: 'Role of admin@example.com' })).toHaveValue('ADMIN');
  });

  it('creates a user, who joins the list', async () => {
    const fake = setup();
    const user = userEvent.setup();
    await rowOf('pat@example.com');
    const form = screen.getByRole('region', { name: 'Create a user' });
    await user.type(within(form).getByLabelText('Email'), 'sam@example.com');
    await user.type(within(form).getByLabelText('Name'), 'Sam');
    await user.selectOptions(within(form).getByLabelText('Role'), 'OPERATOR');
    await user.type(within(form).getByLabelText('Password'), 'a long enough password');
    await user.click(within(form).getByRole('button', { name: 'Create user' }));

    expect(await rowOf('sam@example.com')).toBeInTheDocument();
    expect(fake.sent(CreateUserForm_CreateMutation)[0]?.variables).toEqual({
      input: { email: 'sam@example.com', name: 'Sam', role: 'OPERATOR', password: 'a long enough password' },
    });
  });

  it('tells a non-admin that managing users needs ADMIN', () => {
    const fake = fakeClient([]);
    render(
      <Provider value={fake.client}>
        <UsersPage viewer={{ id: 'u9', role: 'OPERATOR' }} />
      </Provider>,
    );
    expect(screen.getByText(/needs the ADMIN role/)).toBeInTheDocument();
    expect(fake.operations).toHaveLength(0);
  });
});
