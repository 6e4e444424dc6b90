import { Link } from '@tanstack/react-router';
import { PageHeader } from '../common/page';
import type { ExplorerNavigate, ExplorerSearch } from './explorer-search';
import { RegistryExplorer } from './registry-explorer';

export function RegistryPage({
  enabled = true,
  ...props
}: {
  /** False when the server has the explorer turned off (HANGAR_HUB_URL=off): no search box that can only time out. */
  enabled?: boolean;
  canFetch: boolean;
  search?: ExplorerSearch;
  onSearchChange?: ExplorerNavigate;
}) {
  if (!enabled) {
    // Reached only by a typed or old link: the navigation has no Registry entry on such a site.
    return (
      <section>
        <PageHeader title="Registry">The registry explorer is turned off on this server.</PageHeader>
        <p className="empty">
          This Hangar is set up with <code>HANGAR_HUB_URL=off</code>: it reaches no model registry. Fetch files by URL
          on the <Link to="/mirror">Mirror</Link> page, from a server it can reach.
        </p>
      </section>
    );
  }
  return (
    <section>
      <PageHeader title="Registry">
        Search the model registry, see which file sets fit your GPUs before any download, and fetch the right one into
        the mirror.
      </PageHeader>
      <RegistryExplorer {...props} />
    </section>
  );
}
