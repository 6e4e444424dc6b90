import { createFileRoute } from '@tanstack/react-router';
import { PlaceholderPage } from '../../components/common/page';

export const Route = createFileRoute('/_app/registry')({
  component: () => (
    <PlaceholderPage title="Registry">
      Search the model registry, see which file sets fit your GPUs, and fetch the right one into the mirror.
    </PlaceholderPage>
  ),
});
