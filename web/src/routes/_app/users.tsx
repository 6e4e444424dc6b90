import { createFileRoute } from '@tanstack/react-router';
import { UsersPage } from '../../components/users/users-page';

export const Route = createFileRoute('/_app/users')({
  component: UsersRoute,
});

function UsersRoute() {
  const { viewer } = Route.useRouteContext();
  return <UsersPage viewer={{ id: viewer.user.id, role: viewer.role }} />;
}
