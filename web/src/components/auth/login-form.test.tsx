import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { LoginForm, LoginForm_LoginMutation } from './login-form';

function renderForm(login: (v: { email: string; password: string }) => Record<string, unknown>) {
  const fake = fakeClient([answer(LoginForm_LoginMutation, (v) => ({ login: login(v) }))]);
  const onSignedIn = vi.fn();
  render(
    <Provider value={fake.client}>
      <LoginForm onSignedIn={onSignedIn} />
    </Provider>,
  );
  return { fake, onSignedIn };
}

describe('LoginForm', () => {
  it("shows the server's refusal verbatim and stays on the form", async () => {
    const { fake, onSignedIn } = renderForm(() => ({
      __typename: 'UnauthenticatedError',
      message: 'wrong email or password',
      code: 'UNAUTHENTICATED',
    }));
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Email'), 'admin@example.com');
    await user.type(screen.getByLabelText('Password'), 'not the password');
    await user.click(screen.getByRole('button', { name: 'Sign in' }));

    expect(await screen.findByRole('alert')).toHaveTextContent('wrong email or password');
    expect(onSignedIn).not.toHaveBeenCalled();
    expect(fake.sent(LoginForm_LoginMutation)[0]?.variables).toEqual({
      email: 'admin@example.com',
      password: 'not the password',
    });
  });

  it('names the field a validation refusal is about', async () => {
    renderForm(() => ({
      __typename: 'ValidationError',
      message: 'an email address such as admin@example.com',
      code: 'VALIDATION',
      field: 'email',
    }));
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Email'), 'a@b.c');
    await user.type(screen.getByLabelText('Password'), 'x');
    await user.click(screen.getByRole('button', { name: 'Sign in' }));

    // The field by its label, as a person reads it beside the form.
    expect(await screen.findByRole('alert')).toHaveTextContent('Email: an email address such as admin@example.com');
  });

  it('shows a throttled sign-in with its message, like any refusal', async () => {
    const message = 'too many refused sign-ins for admin@example.com from 10.0.0.7: try again in 15 minutes';
    const { onSignedIn } = renderForm(() => ({
      __typename: 'TooManyAttemptsError',
      message,
      code: 'TOO_MANY_ATTEMPTS',
    }));
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Email'), 'admin@example.com');
    await user.type(screen.getByLabelText('Password'), 'guess');
    await user.click(screen.getByRole('button', { name: 'Sign in' }));

    expect(await screen.findByRole('alert')).toHaveTextContent(message);
    expect(onSignedIn).not.toHaveBeenCalled();
  });

  it('hands the signed-in user to the page on success', async () => {
    const { onSignedIn } = renderForm(() => ({
      __typename: 'LoginPayload',
      user: { __typename: 'User', id: 'u1', email: 'admin@example.com', role: 'ADMIN' },
    }));
    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Email'), 'admin@example.com');
    await user.type(screen.getByLabelText('Password'), 'correct-horse-battery');
    await user.click(screen.getByRole('button', { name: 'Sign in' }));

    await vi.waitFor(() => expect(onSignedIn).toHaveBeenCalledWith(expect.objectContaining({ id: 'u1' })));
    expect(screen.queryByRole('alert')).toBeNull();
  });
});
