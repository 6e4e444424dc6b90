import { createFileRoute } from '@tanstack/react-router';
import { TrainJobPage } from '../../components/training/train-job-page';

export const Route = createFileRoute('/_app/training/$id')({
  component: TrainJobRoute,
});

function TrainJobRoute() {
  const { viewer } = Route.useRouteContext();
  const { id } = Route.useParams();
  const navigate = Route.useNavigate();
  return (
    <TrainJobPage
      // A new id (a link from one job to another) is a new page: nothing of the last job's state carries over.
      key={id}
      id={id}
      canChange={viewer.role !== 'VIEWER'}
      onDeleted={() => navigate({ to: '/training', replace: true })}
    />
  );
}
