import { createFileRoute } from '@tanstack/react-router';
import { PlaceholderPage } from '../../components/common/page';

export const Route = createFileRoute('/_app/models')({
  component: () => (
    <PlaceholderPage title="Models">
      The models the fleet serves, how many replicas each runs and where, and their adapters.
    </PlaceholderPage>
  ),
});
