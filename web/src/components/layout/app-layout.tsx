import { Link, Outlet } from '@tanstack/react-router';
import { useState } from 'react';
import { useMutation } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { isRefusal } from '../../graphql/types';
import { describeError, FormError_RefusalFragment } from '../common/form-error';
import { Wordmark } from './wordmark';

export type AppLayout_Viewer = NonNullable<ResultOf<typeof AppLayout_ViewerQuery>['viewer']>;

/** Asked by the authenticated layout's beforeLoad: null sends the visitor to /login. */
export const AppLayout_ViewerQuery = graphql(`
  query AppLayout_Viewer {
    viewer {
      role
      via
      tokenName
      user {
        id
        email
        name
        role
      }
    }
  }
`);

/**
 * Whether this server's registry explorer is on (HANGAR_HUB_URL=off turns it off): asked once with the viewer,
 * so a site with no way out gets no Registry entry and no search box that could only time out.
 */
export const AppLayout_RegistrySettingsQuery = graphql(`
  query AppLayout_RegistrySettings {
    registrySettings {
      enabled
      siteUrl
    }
  }
`);

export const AppLayout_LogoutMutation = graphql(
  `
  mutation AppLayout_Logout {
    logout {
      __typename
      ... on LogoutPayload {
        ok
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

const sections = [
  { to: '/mirror', label: 'Mirror' },
  { to: '/registry', label: 'Registry' },
  { to: '/models', label: 'Models' },
  { to: '/nodes', label: 'Nodes' },
  { to: '/training', label: 'Training' },
  { to: '/audit', label: 'Audit' },
  { to: '/tokens', label: 'Tokens' },
  { to: '/limits', label: 'Limits' },
  { to: '/cost', label: 'Cost' },
  { to: '/orgs', label: 'Organisations' },
] as const;

export function AppLayout({ viewer, registryOn }: { viewer: AppLayout_Viewer; registryOn: boolean }) {
  const shown = sections.filter((s) => registryOn || s.to !== '/registry');
  return (
    <div className="shell">
      <aside className="sidebar">
        <Link to="/mirror" className="sidebar-brand" aria-label="Hangar home">
          <Wordmark />
        </Link>
        <nav aria-label="Main">
          <ul>
            {shown.map((s) => (
              <li key={s.to}>
                <Link to={s.to} activeProps={{ className: 'active', 'aria-current': 'page' }}>
                  {s.label}
                </Link>
              </li>
            ))}
            {viewer.role === 'ADMIN' ? (
              <li>
                <Link to="/users" activeProps={{ className: 'active', 'aria-current': 'page' }}>
                  Users
                </Link>
              </li>
            ) : null}
          </ul>
        </nav>
      </aside>
      <div className="main-column">
        <header className="topbar">
          <SignedInAs viewer={viewer} />
        </header>
        <main className="content">
          <Outlet />
        </main>
      </div>
    </div>
  );
}

function SignedInAs({ viewer }: { viewer: AppLayout_Viewer }) {
  const [{ fetching }, logout] = useMutation(AppLayout_LogoutMutation);
  const [problem, setProblem] = useState<string>();
  const signOut = async () => {
    setProblem(undefined);
    const result = await logout({});
    const outcome = result.data?.logout;
    // A session that has already ended is as signed out as it gets.
    const ended = isRefusal(outcome) && outcome.__typename === 'UnauthenticatedError';
    if (!ended && (result.error || isRefusal(outcome))) {
      setProblem(isRefusal(outcome) ? outcome.message : describeError(result.error));
      return;
    }
    // A full load: nothing of this session (cache, open WebSocket) outlives it.
    window.location.assign('/login');
  };
  return (
    <div className="signed-in">
      {problem ? (
        <span role="alert" className="form-error inline">
          {problem}
        </span>
      ) : null}
      <Link to="/account" className="signed-in-email" title="Your account: change your password">
        {viewer.user.email}
      </Link>
      <span className={`badge role-${viewer.role.toLowerCase()}`} title="Your role">
        {viewer.role}
      </span>
      <button type="button" className="button small" onClick={signOut} disabled={fetching}>
        Sign out
      </button>
    </div>
  );
}
