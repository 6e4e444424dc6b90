import { type Answer, graphql } from '../../graphql/graphql';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { LabelledControl, onFormSubmit, SubmitButton } from '../common/form-parts';
import { useRefusableMutation } from '../common/use-refusable-mutation';

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
  const { fetching, error, refusal, run } = useRefusableMutation(LoginForm_LoginMutation, (d) => d.login);

  const submit = onFormSubmit(async (values) => {
    const outcome = await run({ email: String(values.get('email')), password: String(values.get('password')) });
    if (outcome?.__typename === 'LoginPayload') onSignedIn(outcome.user);
  });

  return (
    <form className="stack" onSubmit={submit} aria-describedby="login-error">
      <LabelledControl label="Email">
        <input name="email" type="email" autoComplete="username" required />
      </LabelledControl>
      <LabelledControl label="Password">
        <input name="password" type="password" autoComplete="current-password" required />
      </LabelledControl>
      <div id="login-error">
        <FormError refusal={refusal} error={error} />
      </div>
      <SubmitButton busy={fetching}>{fetching ? 'Signing in…' : 'Sign in'}</SubmitButton>
    </form>
  );
}
