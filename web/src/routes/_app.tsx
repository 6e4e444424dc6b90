import { createFileRoute, redirect } from '@tanstack/react-router';
import { AppLayout, AppLayout_RegistrySettingsQuery, AppLayout_ViewerQuery } from '../components/layout/app-layout';

// Every page but /login: who is signed in is settled here, once, before any page loads.
export const Route = createFileRoute('/_app')({
  beforeLoad: async ({ context, location }) => {
    const { data, error } = await context.client.query(AppLayout_ViewerQuery, {}).toPromise();
    if (error) throw error;
    if (!data?.viewer) throw redirect({ to: '/login', search: { redirect: location.href } });
    // After the viewer: the settings are for signed-in callers, and a visitor is on the way to /login.
    const settings = await context.client.query(AppLayout_RegistrySettingsQuery, {}).toPromise();
    if (settings.error) throw settings.error;
    return { viewer: data.viewer, registryOn: settings.data?.registrySettings.enabled ?? false };
  },
  component: AppRoute,
});

function AppRoute() {
  const { viewer, registryOn } = Route.useRouteContext();
  return <AppLayout viewer={viewer} registryOn={registryOn} />;
}
