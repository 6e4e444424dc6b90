import { createFileRoute } from '@tanstack/react-router';
import { LimitsPage } from '../../components/limits/limits-page';

export const Route = createFileRoute('/_app/limits')({
  component: LimitsRoute,
});

function LimitsRoute() {
  const { viewer } = Route.useRouteContext();
  return <LimitsPage viewer={{ role: viewer.role }} />;
}
