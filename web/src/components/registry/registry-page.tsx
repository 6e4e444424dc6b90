import { PageHeader } from '../common/page';
import type { ExplorerNavigate, ExplorerSearch } from './explorer-search';
import { RegistryExplorer } from './registry-explorer';

export function RegistryPage(props: { canFetch: boolean; search?: ExplorerSearch; onSearchChange?: ExplorerNavigate }) {
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
