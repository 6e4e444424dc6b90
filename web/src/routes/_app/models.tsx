import { createFileRoute } from '@tanstack/react-router';
import { ModelsPage } from '../../components/models/models-page';

export const Route = createFileRoute('/_app/models')({
  component: ModelsRoute,
});

function ModelsRoute() {
  const { viewer } = Route.useRouteContext();
  return <ModelsPage canChange={viewer.role !== 'VIEWER'} admin={viewer.role === 'ADMIN'} />;
}
