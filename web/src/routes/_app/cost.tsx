import { createFileRoute } from '@tanstack/react-router';
import { CostPage } from '../../components/cost/cost-page';

export const Route = createFileRoute('/_app/cost')({
  component: CostRoute,
});

function CostRoute() {
  const { viewer } = Route.useRouteContext();
  return <CostPage admin={viewer.role === 'ADMIN'} />;
}
