import { createMemoryHistory, RouterProvider } from '@tanstack/react-router';
import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it } from 'vitest';
import { LoginForm_LoginMutation } from './components/auth/login-form';
import { AppLayout_RegistrySettingsQuery, AppLayout_ViewerQuery } from './components/layout/app-layout';
import { MirrorPage_MirrorQuery } from './components/mirror/mirror-page';
import { TokensPage_TokensQuery } from './components/tokens/tokens-page';
import { makeRouter } from './router';
import { answer, fakeClient } from './test/fake-client';

type Role = 'ADMIN' | 'OPERATOR' | 'VIEWER';

const viewer = (role: Role) => ({
  __typename: 'Viewer',
  role,
  via: 'session',
  tokenName: null,
  user: { __typename: 'User', id: 'u1', email: `${role.toLowerCase()}@example.com`, name: 'Pat', role },
});

/** The whole console (generated route tree, layouts, auth) against a fake server. */
function renderApp(path: string, state: { signedInAs: Role | null }) {
  const fake = fakeClient([
    answer(AppLayout_ViewerQuery, () => ({ viewer: state.signedInAs ? viewer(state.signedInAs) : null })),
    answer(AppLayout_RegistrySettingsQuery, () => ({
      registrySettings: { __typename: 'RegistrySettings', enabled: true, siteUrl: 'https://huggingface.co' },
    })),
    answer(LoginForm_LoginMutation, () => {
      state.signedInAs = 'OPERATOR';
      return {
        login: {
          __typename: 'LoginPayload',
          user: { __typename: 'User', id: 'u1', email: 'operator@example.com', role: 'OPERATOR' },
        },
      };
    }),
    answer(TokensPage_TokensQuery, () => ({ apiTokens: [] })),
    answer(MirrorPage_MirrorQuery, () => ({
      mirror: {
        __typename: 'Mirror',
        baseUrl: 'http://hangar.test/mirror',
        fetching: 0,
        present: 0,
        failed: 0,
        diskFreeBytes: 0,
        families: [],
      },
    })),
  ]);
  const router = makeRouter(fake.client, createMemoryHistory({ initialEntries: [path] }));
  render(
    <Provider value={fake.client}>
      <RouterProvider router={router} />
    </Provider>,
  );
  return { fake, router };
}

describe('the console', () => {
  it('sends an anonymous visitor to sign in, then back to the page they asked for', async () => {
    const state = { signedInAs: null as Role | null };
    const { router } = renderApp('/tokens', state);

    expect(await screen.findByRole('button', { name: 'Sign in' })).toBeInTheDocument();
    expect(router.state.location.pathname).toBe('/login');
    expect(router.state.location.search).toEqual({ redirect: '/tokens' });
    expect(screen.queryByRole('navigation')).toBeNull();

    const user = userEvent.setup();
    await user.type(screen.getByLabelText('Email'), 'operator@example.com');
    await user.type(screen.getByLabelText('Password'), 'correct-horse-battery');
    await user.click(screen.getByRole('button', { name: 'Sign in' }));

    expect(await screen.findByRole('heading', { name: 'Tokens' })).toBeInTheDocument();
    expect(router.state.location.pathname).toBe('/tokens');
    expect(screen.getByText('operator@example.com')).toBeInTheDocument();
  });

  it('ignores a redirect to another site', async () => {
    const { router } = renderApp('/login?redirect=%2F%2Fevil.example%2F', { signedInAs: null });
    expect(await screen.findByRole('button', { name: 'Sign in' })).toBeInTheDocument();
    expect(router.state.location.search).toEqual({});
  });

  it('shows an operator every section but Users, with their email, role and Sign out', async () => {
    const { router } = renderApp('/', { signedInAs: 'OPERATOR' });

    expect(await screen.findByRole('heading', { name: 'Mirror' })).toBeInTheDocument();
    expect(router.state.location.pathname).toBe('/mirror');
    const nav = screen.getByRole('navigation', { name: 'Main' });
    expect(
      within(nav)
        .getAllByRole('link')
        .map((a) => a.textContent),
    ).toEqual([
      'Mirror',
      'Registry',
      'Models',
      'Nodes',
      'Training',
      'Audit',
      'Tokens',
      'Limits',
      'Cost',
      'Organisations',
    ]);
    expect(within(nav).getByRole('link', { name: 'Mirror' })).toHaveAttribute('aria-current', 'page');
    expect(screen.getByText('operator@example.com')).toBeInTheDocument();
    expect(screen.getByText('OPERATOR')).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Sign out' })).toBeInTheDocument();
  });

  it('shows an admin the Users section', async () => {
    renderApp('/registry', { signedInAs: 'ADMIN' });
    expect(await screen.findByRole('heading', { name: 'Registry' })).toBeInTheDocument();
    expect(screen.getByRole('link', { name: 'Users' })).toHaveAttribute('href', '/users');
  });
});
