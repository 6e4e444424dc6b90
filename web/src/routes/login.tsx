import { createFileRoute, redirect } from '@tanstack/react-router';
import { z } from 'zod';
import { LoginPage } from '../components/auth/login-page';
import { AppLayout_ViewerQuery } from '../components/layout/app-layout';

// Only a path on this site (not "//elsewhere", not the sign-in page itself); anything else is dropped.
const search = z.object({
  redirect: z
    .string()
    .refine((r) => r.startsWith('/') && !r.startsWith('//') && !r.startsWith('/login'))
    .optional()
    .catch(undefined),
});

export const Route = createFileRoute('/login')({
  validateSearch: search,
  beforeLoad: async ({ context, search }) => {
    const { data } = await context.client.query(AppLayout_ViewerQuery, {}).toPromise();
    if (data?.viewer) throw redirect({ href: search.redirect ?? '/mirror' });
  },
  component: LoginRoute,
});

function LoginRoute() {
  const { redirect: to } = Route.useSearch();
  const navigate = Route.useNavigate();
  return <LoginPage onSignedIn={() => navigate({ href: to ?? '/mirror', replace: true })} />;
}
