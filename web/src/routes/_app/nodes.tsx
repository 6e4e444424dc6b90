import { createFileRoute } from '@tanstack/react-router';
import { NodesPage } from '../../components/nodes/nodes-page';

export const Route = createFileRoute('/_app/nodes')({
  component: NodesRoute,
});

function NodesRoute() {
  const { viewer } = Route.useRouteContext();
  return <NodesPage canAdd={viewer.role === 'ADMIN'} />;
}
