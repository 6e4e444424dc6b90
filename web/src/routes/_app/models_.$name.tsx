import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { ModelPage } from '../../components/models/model-page';

// /models/<name>: one model and its playground, a page of its own rather than a child of the Models list (the
// trailing underscore in the file name). ?call=<adapter>: the adapter the playground calls, kept across a reload
// and in a shared link; absent, it calls the model itself.
const search = z.object({
  call: z.string().max(200).optional().catch(undefined),
});

export const Route = createFileRoute('/_app/models_/$name')({
  validateSearch: search,
  component: ModelRoute,
});

function ModelRoute() {
  const { viewer } = Route.useRouteContext();
  const { name } = Route.useParams();
  const { call } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <ModelPage
      // Another model is another page: nothing of this conversation carries over.
      key={name}
      name={name}
      canChange={viewer.role !== 'VIEWER'}
      call={call}
      onCallChange={(next) => navigate({ search: { call: next }, replace: true, resetScroll: false })}
    />
  );
}
