import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { MirrorPage } from '../../components/mirror/mirror-page';
import { explorerSearch } from '../../components/registry/explorer-search';

// ?fetch=true: the fetch form is open, and stays open across a reload or a shared link. The registry explorer at
// the bottom of the page keeps its search and open repository the same way (q, sort, repo, ctx).
const search = explorerSearch.extend({ fetch: z.boolean().optional().catch(undefined) });

export const Route = createFileRoute('/_app/mirror')({
  validateSearch: search,
  component: MirrorRoute,
});

function MirrorRoute() {
  const { viewer } = Route.useRouteContext();
  const { fetch: fetchOpen, ...registrySearch } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <MirrorPage
      canChange={viewer.role !== 'VIEWER'}
      fetchOpen={fetchOpen ?? false}
      onFetchOpenChange={(open) =>
        navigate({ search: (prev) => ({ ...prev, fetch: open || undefined }), replace: true, resetScroll: false })
      }
      registrySearch={registrySearch}
      // resetScroll: false: the explorer sits at the bottom of the page, and opening a repository must leave it there.
      onRegistrySearchChange={(next, how) =>
        navigate({ search: (prev) => ({ ...prev, ...next }), replace: !how?.push, resetScroll: false })
      }
    />
  );
}
