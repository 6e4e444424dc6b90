import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { MirrorPage } from '../../components/mirror/mirror-page';
import { explorerSearch } from '../../components/registry/explorer-search';

// ?fetch=true: the fetch form is open, and stays open across a reload or a shared link; ?serve=model/version: the
// serve form beneath that version's row is. The registry explorer at the bottom of the page keeps its search, open
// repository and serve job the same way (q, sort, repo, ctx, job).
const search = explorerSearch.extend({
  fetch: z.boolean().optional().catch(undefined),
  serve: z
    .string()
    .max(300)
    .regex(/^[^/]+\/[^/]+$/)
    .optional()
    .catch(undefined),
});

export const Route = createFileRoute('/_app/mirror')({
  validateSearch: search,
  component: MirrorRoute,
});

function MirrorRoute() {
  const { viewer } = Route.useRouteContext();
  const { fetch: fetchOpen, serve, ...registrySearch } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <MirrorPage
      canChange={viewer.role !== 'VIEWER'}
      fetchOpen={fetchOpen ?? false}
      onFetchOpenChange={(open) =>
        navigate({ search: (prev) => ({ ...prev, fetch: open || undefined }), replace: true, resetScroll: false })
      }
      serve={serve}
      onServeChange={(next) =>
        navigate({ search: (prev) => ({ ...prev, serve: next }), replace: true, resetScroll: false })
      }
      registrySearch={registrySearch}
      // resetScroll: false: the explorer sits at the bottom of the page, and opening a repository must leave it there.
      onRegistrySearchChange={(next, how) =>
        navigate({ search: (prev) => ({ ...prev, ...next }), replace: !how?.push, resetScroll: false })
      }
    />
  );
}
