import { createFileRoute } from '@tanstack/react-router';
import { PlaceholderPage } from '../../components/common/page';

export const Route = createFileRoute('/_app/mirror')({
  component: () => (
    <PlaceholderPage title="Mirror">
      The model files this Hangar keeps, by model and version, with what is arriving and what failed.
    </PlaceholderPage>
  ),
});
