import { createFileRoute } from '@tanstack/react-router';
import { AccountPage } from '../../components/users/account-page';

export const Route = createFileRoute('/_app/account')({
  component: AccountRoute,
});

function AccountRoute() {
  const { viewer } = Route.useRouteContext();
  return <AccountPage viewer={{ ...viewer.user, role: viewer.role, via: viewer.via }} />;
}
