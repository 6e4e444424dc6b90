import { createFileRoute } from '@tanstack/react-router';
import { z } from 'zod';
import { MirrorPage } from '../../components/mirror/mirror-page';
import { type StateFilter, stateFilters } from '../../components/mirror/mirror-table';
import { explorerSearch } from '../../components/registry/explorer-search';

// ?fetch=true: the fetch form is open, and stays open across a reload or a shared link; ?serve=model/version: the
// serve form beneath that version's row is. The registry explorer at the bottom of the page keeps its search, open
// repository and serve job the same way (q, sort, repo, ctx, job). ?name=…&state=…: the listing's filter.
const search = explorerSearch.extend({
  name: z.string().max(200).optional().catch(undefined),
  state: z
    .enum(Object.keys(stateFilters) as [StateFilter, ...StateFilter[]])
    .optional()
    .catch(undefined),
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
  const { viewer, registryOn } = Route.useRouteContext();
  const { fetch: fetchOpen, serve, name, state, ...registrySearch } = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <MirrorPage
      canChange={viewer.role !== 'VIEWER'}
      registryOn={registryOn}
      fetchOpen={fetchOpen ?? false}
      onFetchOpenChange={(open) =>
        navigate({ search: (prev) => ({ ...prev, fetch: open || undefined }), replace: true, resetScroll: false })
      }
      serve={serve}
      filter={{ name, state }}
      onFilterChange={(next) =>
        navigate({ search: (prev) => ({ ...prev, ...next }), replace: true, resetScroll: false })
      }
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
