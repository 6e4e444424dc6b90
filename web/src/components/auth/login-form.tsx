import { type FormEvent, useState } from 'react';
import { useMutation } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import type { Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { FormError, FormError_RefusalFragment } from '../common/form-error';

type SignedIn = Answer<typeof LoginForm_LoginMutation, 'login', 'LoginPayload'>;

export const LoginForm_LoginMutation = graphql(
  `
  mutation LoginForm_Login($email: String!, $password: String!) {
    login(email: $email, password: $password) {
      __typename
      ... on LoginPayload {
        user {
          id
          email
          role
        }
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/**
 * Email and password. The server sets the session cookie (HttpOnly) and the CSRF cookie the client reads; the
 * page that asked for sign-in decides where to go next.
 */
export function LoginForm({ onSignedIn }: { onSignedIn: (user: SignedIn['user']) => void }) {
  const [{ fetching, error }, login] = useMutation(LoginForm_LoginMutation);
  const [refusal, setRefusal] = useState<Refusal | null>(null);

  const submit = async (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    setRefusal(null);
    const result = await login({ email: String(form.get('email')), password: String(form.get('password')) });
    const outcome = result.data?.login;
    if (isRefusal(outcome)) setRefusal(outcome);
    else if (outcome?.__typename === 'LoginPayload') onSignedIn(outcome.user);
  };

  return (
    <form className="stack" onSubmit={submit} aria-describedby="login-error">
      <label className="field">
        <span>Email</span>
        <input name="email" type="email" autoComplete="username" required />
      </label>
      <label className="field">
        <span>Password</span>
        <input name="password" type="password" autoComplete="current-password" required />
      </label>
      <div id="login-error">
        <FormError refusal={refusal} error={error} />
      </div>
      <button type="submit" className="button primary" disabled={fetching}>
        {fetching ? 'Signing in…' : 'Sign in'}
      </button>
    </form>
  );
}
