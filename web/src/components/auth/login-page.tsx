import { Wordmark } from '../layout/wordmark';
import { LoginForm } from './login-form';

export function LoginPage({ onSignedIn }: { onSignedIn: () => void }) {
  return (
    <main className="login">
      <div className="login-card">
        <Wordmark />
        <h1>Sign in</h1>
        <p className="muted">The control plane for this LLM fleet: its mirror, models, nodes and training.</p>
        <LoginForm onSignedIn={onSignedIn} />
      </div>
    </main>
  );
}
