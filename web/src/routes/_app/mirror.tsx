import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { MirrorPage } from '../../components/mirror/mirror-page';

// ?fetch=true: the fetch form is open, and stays open across a reload or a shared link.
const search = z.object({ fetch: z.boolean().optional().catch(undefined) });

export const Route = createFileRoute('/_app/mirror')({
  validateSearch: search,
  component: MirrorRoute,
});

function MirrorRoute() {
  const { viewer } = Route.useRouteContext();
  const { fetch: fetchOpen } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <MirrorPage
      canChange={viewer.role !== 'VIEWER'}
      fetchOpen={fetchOpen ?? false}
      onFetchOpenChange={(open) => navigate({ search: { fetch: open || undefined }, replace: true })}
    />
  );
}
