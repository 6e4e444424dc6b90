import type { Role } from '../../graphql/types';
import { PageHeader } from '../common/page';
import { ChangePasswordForm } from './change-password-form';

/** The signed-in user's own account: who they are here, and their password. */
export function AccountPage({ viewer }: { viewer: { email: string; name: string; role: Role; via: string } }) {
  return (
    <section>
      <PageHeader title="Account">
        Signed in as {viewer.name} ({viewer.email}) with the role {viewer.role}.
      </PageHeader>
      {viewer.via === 'session' ? (
        <ChangePasswordForm />
      ) : (
        <p className="muted">This console is used with an API token; sign in with your password to change it.</p>
      )}
    </section>
  );
}
