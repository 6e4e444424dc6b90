import { createFileRoute } from '@tanstack/react-router';
import { NewTrainJobPage } from '../../components/training/new-train-job';

export const Route = createFileRoute('/_app/training/new')({
  component: NewTrainJobRoute,
});

function NewTrainJobRoute() {
  const { viewer } = Route.useRouteContext();
  const navigate = Route.useNavigate();
  return (
    <NewTrainJobPage
      canChange={viewer.role !== 'VIEWER'}
      // The job's page follows it from the queue to the end.
      onCreated={(id) => navigate({ to: '/training/$id', params: { id } })}
    />
  );
}
