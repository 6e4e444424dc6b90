import { createFileRoute, redirect } from '@tanstack/react-router';
import { AppLayout, AppLayout_ViewerQuery } from '../components/layout/app-layout';

// Every page but /login: who is signed in is settled here, once, before any page loads.
export const Route = createFileRoute('/_app')({
  beforeLoad: async ({ context, location }) => {
    const { data, error } = await context.client.query(AppLayout_ViewerQuery, {}).toPromise();
    if (error) throw error;
    if (!data?.viewer) throw redirect({ to: '/login', search: { redirect: location.href } });
    return { viewer: data.viewer };
  },
  component: AppRoute,
});

function AppRoute() {
  const { viewer } = Route.useRouteContext();
  return <AppLayout viewer={viewer} />;
}
