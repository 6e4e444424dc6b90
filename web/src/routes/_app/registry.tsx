import { createFileRoute } from '@tanstack/react-router';
import { explorerSearch } from '../../components/registry/explorer-search';
import { RegistryPage } from '../../components/registry/registry-page';

// ?q=…&sort=…&repo=owner/name&ctx=…: the search and the open repository survive a reload or a shared link.
export const Route = createFileRoute('/_app/registry')({
  validateSearch: explorerSearch,
  component: RegistryRoute,
});

function RegistryRoute() {
  const { viewer, registryOn } = Route.useRouteContext();
  const search = Route.useSearch();
  const navigate = Route.useNavigate();
  return (
    <RegistryPage
      enabled={registryOn}
      canFetch={viewer.role !== 'VIEWER'}
      search={search}
      // resetScroll: false, so opening a repository far down the list does not throw the page back to the top.
      onSearchChange={(next, how) =>
        navigate({ search: (prev) => ({ ...prev, ...next }), replace: !how?.push, resetScroll: false })
      }
    />
  );
}
