import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { TrainingList } from '../../components/training/training-list';
import { jobStates } from '../../graphql/types';

// ?state=RUNNING: the list shows only the jobs in that state, across a reload or a shared link. A state that does
// not parse is dropped rather than failing the page.
const search = z.object({
  state: z.enum(jobStates).optional().catch(undefined),
});

export const Route = createFileRoute('/_app/training/')({
  validateSearch: search,
  component: TrainingRoute,
});

function TrainingRoute() {
  const { viewer } = Route.useRouteContext();
  const { state } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <TrainingList
      state={state}
      onStateChange={(next) => navigate({ search: (prev) => ({ ...prev, state: next }), replace: true })}
      canChange={viewer.role !== 'VIEWER'}
    />
  );
}
