import { createFileRoute } from '@tanstack/react-router';
import { OrgsPage } from '../../components/orgs/orgs-page';

export const Route = createFileRoute('/_app/orgs')({
  component: OrgsRoute,
});

function OrgsRoute() {
  const { viewer } = Route.useRouteContext();
  return <OrgsPage viewer={{ role: viewer.role }} />;
}
