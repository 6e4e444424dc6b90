import { createFileRoute } from '@tanstack/react-router';
import { PlaceholderPage } from '../../components/common/page';

export const Route = createFileRoute('/_app/training')({
  component: () => (
    <PlaceholderPage title="Training">
      LoRA training jobs on the fleet's GPUs: their progress and loss, and the adapters they publish.
    </PlaceholderPage>
  ),
});
