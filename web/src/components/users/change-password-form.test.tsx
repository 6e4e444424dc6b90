import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { ChangePasswordForm, ChangePasswordForm_ChangeMutation } from './change-password-form';

function setup() {
  const fake = fakeClient([
    answer(ChangePasswordForm_ChangeMutation, ({ input }) =>
      input.currentPassword === 'the right one'
        ? { changePassword: { __typename: 'PasswordChanged', signedOut: 2 } }
        : {
            changePassword: {
              __typename: 'ValidationError',
              code: 'VALIDATION',
              field: 'input.currentPassword',
              message: 'input.currentPassword: this is not your current password',
            },
          },
    ),
  ]);
  render(
    <Provider value={fake.client}>
      <ChangePasswordForm />
    </Provider>,
  );
  return fake;
}

async function fill(current: string, next: string, again = next) {
  const user = userEvent.setup();
  await user.clear(screen.getByLabelText('Current password'));
  await user.type(screen.getByLabelText('Current password'), current);
  await user.clear(screen.getByLabelText('New password'));
  await user.type(screen.getByLabelText('New password'), next);
  await user.clear(screen.getByLabelText('New password again'));
  await user.type(screen.getByLabelText('New password again'), again);
  await user.click(screen.getByRole('button', { name: 'Change password' }));
}

describe('ChangePasswordForm', () => {
  it('refuses two different new passwords without asking the server', async () => {
    const fake = setup();
    await fill('the right one', 'a new long password', 'another long password');
    expect(await screen.findByText(/the two new passwords differ/)).toBeInTheDocument();
    expect(fake.sent(ChangePasswordForm_ChangeMutation)).toEqual([]);
  });

  it("shows the server's refusal under the field it names, then the change and how many sessions ended", async () => {
    const fake = setup();
    await fill('a wrong one', 'a new long password');
    // At the field its label names, without the GraphQL path the server's message starts with.
    expect(await screen.findByText('this is not your current password')).toBeInTheDocument();
    expect(screen.getByLabelText('Current password')).toHaveAttribute('aria-invalid', 'true');
    await fill('the right one', 'a new long password');
    expect(await screen.findByRole('status')).toHaveTextContent('Password changed. 2 other sessions were signed out.');
    expect(fake.sent(ChangePasswordForm_ChangeMutation).map((op) => op.variables)).toEqual([
      { input: { currentPassword: 'a wrong one', newPassword: 'a new long password' } },
      { input: { currentPassword: 'the right one', newPassword: 'a new long password' } },
    ]);
  });
});
