import { createFileRoute } from '@tanstack/react-router';
import { TokensPage } from '../../components/tokens/tokens-page';

export const Route = createFileRoute('/_app/tokens')({
  component: TokensRoute,
});

function TokensRoute() {
  const { viewer } = Route.useRouteContext();
  return <TokensPage viewer={{ role: viewer.role }} />;
}
