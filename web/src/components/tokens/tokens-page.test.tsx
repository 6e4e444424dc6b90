import { render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { answer, fakeClient } from '../../test/fake-client';
import { CreateTokenForm_CreateMutation } from './create-token-form';
import { TokenRow_RevokeMutation, TokenRow_SetBatchMutation } from './token-table';
import { TokensPage, TokensPage_TokensQuery } from './tokens-page';

const existing = {
  __typename: 'ApiToken',
  id: 't1',
  name: 'nightly-sync',
  prefix: 'hgr_a1b2',
  role: 'VIEWER',
  callerOnly: false,
  batch: false,
  limits: [],
  createdAt: '2026-01-01T00:00:00.000Z',
  expiresAt: null,
  lastUsedAt: null,
  revokedAt: null,
  active: true,
};

const secret = 'hgr_c3d4e5f6_secret_shown_once';

function setup() {
  const fake = fakeClient([
    answer(TokensPage_TokensQuery, () => ({ apiTokens: [existing] })),
    answer(CreateTokenForm_CreateMutation, ({ input }) => {
      return {
        createApiToken: {
          __typename: 'CreatedApiToken',
          secret,
          token: {
            ...existing,
            id: 't2',
            name: input.name,
            prefix: 'hgr_c3d4',
            role: input.role,
            callerOnly: input.callerOnly,
            batch: input.batch ?? false,
            expiresAt: input.expiresAt,
            createdAt: new Date().toISOString(),
          },
        },
      };
    }),
    answer(TokenRow_SetBatchMutation, (v) => ({ setTokenBatch: { ...existing, id: v.id, batch: v.batch } })),
    answer(TokenRow_RevokeMutation, (v) => ({
      revokeApiToken: { ...existing, id: v.id, active: false, revokedAt: new Date().toISOString() },
    })),
  ]);
  const view = render(
    <Provider value={fake.client}>
      <TokensPage />
    </Provider>,
  );
  return { fake, view };
}

describe('TokensPage', () => {
  it('shows a new token’s secret once, with a curl example, and lists the token', async () => {
    const { fake, view } = setup();
    const user = userEvent.setup();
    expect(await screen.findByRole('rowheader', { name: 'nightly-sync' })).toBeInTheDocument();
    expect(screen.queryByTestId('token-secret')).toBeNull();

    const listFetches = fake.sent(TokensPage_TokensQuery).length;
    await user.type(screen.getByLabelText('Token name'), 'ci-deploy');
    await user.selectOptions(screen.getByLabelText('Role'), 'OPERATOR');
    await user.click(screen.getByRole('button', { name: 'Create token' }));

    expect(await screen.findByTestId('token-secret')).toHaveTextContent(secret);
    expect(screen.getByText(/will not be shown again/)).toBeInTheDocument();
    expect(screen.getByRole('button', { name: 'Copy secret' })).toBeInTheDocument();
    expect(screen.getByTestId('token-curl')).toHaveTextContent(
      `curl -s ${window.location.origin}/graphql -H 'Authorization: Bearer ${secret}'`,
    );
    expect(fake.sent(CreateTokenForm_CreateMutation)[0]?.variables).toEqual({
      input: { name: 'ci-deploy', role: 'OPERATOR', expiresAt: null, callerOnly: false, batch: false },
    });
    expect(screen.queryByText('caller')).toBeNull();
    // The new token joins the list (graphcache's updater) without a refetch, newest first.
    await vi.waitFor(() => {
      const rows = screen.getAllByRole('row').slice(1);
      expect(rows.map((r) => within(r).getByRole('rowheader').textContent)).toEqual(['ci-deploy', 'nightly-sync']);
    });
    expect(fake.sent(TokensPage_TokensQuery)).toHaveLength(listFetches);

    // Dismissed, it is gone; coming back to the page does not bring it back.
    await user.click(screen.getByRole('button', { name: 'I have copied it' }));
    expect(screen.queryByTestId('token-secret')).toBeNull();
    view.unmount();
    render(
      <Provider value={fake.client}>
        <TokensPage />
      </Provider>,
    );
    expect(await screen.findByRole('rowheader', { name: 'ci-deploy' })).toBeInTheDocument();
    expect(screen.queryByTestId('token-secret')).toBeNull();
    expect(document.body).not.toHaveTextContent(secret);
  });

  it('makes a caller token when asked: its example calls /v1, and its row says caller', async () => {
    const { fake } = setup();
    const user = userEvent.setup();
    expect(await screen.findByRole('rowheader', { name: 'nightly-sync' })).toBeInTheDocument();
    await user.type(screen.getByLabelText('Token name'), 'chat-app');
    await user.click(screen.getByRole('checkbox', { name: 'caller only (calls models at /v1, nothing else)' }));
    await user.click(screen.getByRole('button', { name: 'Create token' }));

    expect(await screen.findByTestId('token-secret')).toHaveTextContent(secret);
    expect(fake.sent(CreateTokenForm_CreateMutation)[0]?.variables).toEqual({
      input: { name: 'chat-app', role: 'VIEWER', expiresAt: null, callerOnly: true, batch: false },
    });
    // The control plane refuses a caller token: the example is the call it is for.
    expect(screen.getByTestId('token-curl')).toHaveTextContent(
      `curl -s ${window.location.origin}/v1/models -H 'Authorization: Bearer ${secret}'`,
    );
    const row = (await screen.findByRole('rowheader', { name: /chat-app/ })).closest('tr') as HTMLElement;
    expect(within(row).getByText('caller')).toBeInTheDocument();
    const other = screen.getByRole('rowheader', { name: 'nightly-sync' }).closest('tr') as HTMLElement;
    expect(within(other).queryByText('caller')).toBeNull();
    // The form is ready for the next token, a normal one.
    expect(screen.getByRole('checkbox', { name: /caller only/ })).not.toBeChecked();
  });

  it('makes a batch token when asked, and marks an existing token batch and back from its row', async () => {
    const { fake } = setup();
    const user = userEvent.setup();
    expect(await screen.findByRole('rowheader', { name: 'nightly-sync' })).toBeInTheDocument();
    await user.type(screen.getByLabelText('Token name'), 'eval-job');
    await user.click(screen.getByRole('checkbox', { name: 'batch (waits behind interactive requests)' }));
    await user.click(screen.getByRole('button', { name: 'Create token' }));
    expect(await screen.findByTestId('token-secret')).toHaveTextContent(secret);
    expect(fake.sent(CreateTokenForm_CreateMutation)[0]?.variables).toEqual({
      input: { name: 'eval-job', role: 'VIEWER', expiresAt: null, callerOnly: false, batch: true },
    });
    const made = (await screen.findByRole('rowheader', { name: /eval-job/ })).closest('tr') as HTMLElement;
    expect(within(made).getByText('batch')).toBeInTheDocument();
    expect(within(made).getByRole('button', { name: 'Mark interactive' })).toBeInTheDocument();

    const row = screen.getByRole('rowheader', { name: 'nightly-sync' }).closest('tr') as HTMLElement;
    expect(within(row).queryByText('batch')).toBeNull();
    await user.click(within(row).getByRole('button', { name: 'Mark batch' }));
    expect(await within(row).findByText('batch')).toBeInTheDocument();
    expect(fake.sent(TokenRow_SetBatchMutation)[0]?.variables).toEqual({ id: 't1', batch: true });
    await user.click(within(row).getByRole('button', { name: 'Mark interactive' }));
    await vi.waitFor(() => expect(within(row).queryByText('batch')).toBeNull());
    expect(fake.sent(TokenRow_SetBatchMutation)[1]?.variables).toEqual({ id: 't1', batch: false });
  });

  it('revokes a token: its row then says revoked and offers no Revoke', async () => {
    const { fake } = setup();
    const user = userEvent.setup();
    const row = (await screen.findByRole('rowheader', { name: 'nightly-sync' })).closest('tr') as HTMLElement;
    expect(within(row).getByText('active')).toBeInTheDocument();

    await user.click(within(row).getByRole('button', { name: 'Revoke' }));

    expect(await within(row).findByText('revoked')).toBeInTheDocument();
    expect(within(row).queryByRole('button', { name: 'Revoke' })).toBeNull();
    expect(fake.sent(TokenRow_RevokeMutation)[0]?.variables).toEqual({ id: 't1' });
  });

  it('shows a refusal next to the form', async () => {
    const fake = fakeClient([
      answer(TokensPage_TokensQuery, () => ({ apiTokens: [] })),
      answer(CreateTokenForm_CreateMutation, () => ({
        createApiToken: {
          __typename: 'ForbiddenError',
          message: 'a token can hold at most your own role (OPERATOR)',
          code: 'FORBIDDEN',
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <TokensPage />
      </Provider>,
    );
    const user = userEvent.setup();
    expect(await screen.findByText(/No API tokens yet/)).toBeInTheDocument();
    await user.type(screen.getByLabelText('Token name'), 'too-strong');
    await user.selectOptions(screen.getByLabelText('Role'), 'ADMIN');
    await user.click(screen.getByRole('button', { name: 'Create token' }));

    expect(await screen.findByRole('alert')).toHaveTextContent('a token can hold at most your own role (OPERATOR)');
    expect(screen.queryByTestId('token-secret')).toBeNull();
  });

  it('offers only the roles the signed-in person may give: an operator is not offered ADMIN', async () => {
    const fake = fakeClient([answer(TokensPage_TokensQuery, () => ({ apiTokens: [] }))]);
    render(
      <Provider value={fake.client}>
        <TokensPage viewer={{ role: 'OPERATOR' }} />
      </Provider>,
    );
    const role = await screen.findByLabelText('Role');
    const offered = within(role)
      .getAllByRole('option')
      .map((o) => o.getAttribute('value'));
    expect(offered).toEqual(['VIEWER', 'OPERATOR']);
  });
});
