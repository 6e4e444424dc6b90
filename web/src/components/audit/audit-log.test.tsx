import { act, render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { Provider } from 'urql';
import { describe, expect, it, vi } from 'vitest';
import { live } from '../../graphql/live';
import { answer, fakeClient } from '../../test/fake-client';
import { AuditLog, AuditLog_EventAddedSubscription, AuditLog_EventsQuery } from './audit-log';

const event = (id: number, outcome: 'DONE' | 'REFUSED' | 'FAILED', action: string, message: string | null = null) => ({
  __typename: 'AuditEvent',
  id: String(id),
  at: new Date(Date.now() - (100 - id) * 60_000).toISOString(),
  actor: 'user:admin@example.com',
  action,
  target: `thing-${id}`,
  outcome,
  message,
  requestId: `req-${id}`,
  ownerName: null,
});

// The server's log, newest first, paged by cursor (the id of the last event of the previous page).
const log = [
  event(5, 'DONE', 'createApiToken', 'created token "ci"'),
  event(4, 'REFUSED', 'createUser', 'a user with this email exists'),
  event(3, 'FAILED', 'createNode', 'unexpected error'),
  event(2, 'DONE', 'login'),
];

function page(first: number, after: string | null) {
  const start = after === null ? 0 : log.findIndex((e) => e.id === after) + 1;
  const rows = log.slice(start, start + first);
  return {
    auditEvents: {
      __typename: 'AuditEventConnection',
      edges: rows.map((node) => ({ __typename: 'AuditEventEdge', cursor: node.id, node })),
      pageInfo: {
        __typename: 'PageInfo',
        hasNextPage: start + first < log.length,
        endCursor: rows.at(-1)?.id ?? null,
      },
    },
  };
}

/** The Action column of the event rows, top to bottom (the header row and the "Load more" row left out). */
function actions() {
  return screen
    .getAllByRole('row')
    .map((r) => within(r).queryAllByRole('cell'))
    .filter((cells) => cells.length === 6)
    .map((cells) => cells[2]?.textContent);
}

describe('AuditLog', () => {
  it('renders outcomes as badges, pages with Load more, and puts live events on top', async () => {
    const fake = fakeClient([answer(AuditLog_EventsQuery, (v) => page(v.first, v.after ?? null))]);
    render(
      <Provider value={fake.client}>
        <AuditLog pageSize={2} />
      </Provider>,
    );
    const user = userEvent.setup();

    await screen.findByText('createApiToken');
    expect(actions()).toEqual(['createApiToken', 'createUser']);
    const done = screen.getByText('DONE');
    const refused = screen.getByText('REFUSED');
    expect(done).toHaveClass('badge', 'ok');
    expect(refused).toHaveClass('badge', 'warn');
    expect(screen.getByText('a user with this email exists')).toBeInTheDocument();

    await user.click(screen.getByRole('button', { name: 'Load more' }));
    await vi.waitFor(() => expect(actions()).toEqual(['createApiToken', 'createUser', 'createNode', 'login']));
    expect(screen.getByText('FAILED')).toHaveClass('badge', 'bad');
    const pages = fake.sent(AuditLog_EventsQuery).map((op) => JSON.stringify(op.variables));
    expect([...new Set(pages)]).toEqual([
      '{"first":2,"after":null,"filter":null}',
      '{"first":2,"after":"4","filter":null}',
    ]);
    expect(screen.queryByRole('button', { name: 'Load more' })).toBeNull();

    // An event committed elsewhere arrives over the subscription and goes on top, without a refetch.
    expect(fake.sent(AuditLog_EventAddedSubscription)).toHaveLength(1);
    const fetches = fake.sent(AuditLog_EventsQuery).length;
    fake.push(AuditLog_EventAddedSubscription, {
      auditEventAdded: event(6, 'REFUSED', 'revokeApiToken', 'only the owner or an admin can revoke it'),
    });
    await vi.waitFor(() =>
      expect(actions()).toEqual(['revokeApiToken', 'createApiToken', 'createUser', 'createNode', 'login']),
    );
    const first = screen.getAllByRole('row')[1] as HTMLElement;
    expect(within(first).getByText('REFUSED')).toHaveClass('badge', 'warn');
    expect(within(first).getByText('only the owner or an admin can revoke it')).toBeInTheDocument();
    expect(fake.sent(AuditLog_EventsQuery)).toHaveLength(fetches);

    // The same event delivered twice is listed once.
    fake.push(AuditLog_EventAddedSubscription, { auditEventAdded: event(6, 'REFUSED', 'revokeApiToken', 'again') });
    await vi.waitFor(() => expect(screen.getByText('again')).toBeInTheDocument());
    expect(actions()).toHaveLength(5);
  });

  it('re-reads the first page when the live connection comes back', async () => {
    const fake = fakeClient([answer(AuditLog_EventsQuery, (v) => page(v.first, v.after ?? null))]);
    render(
      <Provider value={fake.client}>
        <AuditLog pageSize={2} />
      </Provider>,
    );
    await screen.findByText('createApiToken');
    const before = fake.sent(AuditLog_EventsQuery).length;
    // Events committed while the socket was down are not replayed: the page reads the current state instead.
    log.unshift(event(7, 'DONE', 'updateUser', 'role OPERATOR'));
    act(() => live.set('live', true));
    await vi.waitFor(() => expect(actions()).toEqual(['updateUser', 'createApiToken']));
    expect(fake.sent(AuditLog_EventsQuery).length).toBe(before + 1);
    log.shift();
  });

  it('asks the server for the filter in the URL, sets a new one from the form, and takes only matching live events', async () => {
    const fake = fakeClient([
      answer(AuditLog_EventsQuery, (v) => {
        const all = page(50, null).auditEvents;
        const part = (v.filter?.action ?? '').toLowerCase();
        const edges = all.edges.filter((e) => e.node.action.toLowerCase().includes(part));
        return { auditEvents: { ...all, edges, pageInfo: { ...all.pageInfo, hasNextPage: false } } };
      }),
    ]);
    const onSearch = vi.fn();
    render(
      <Provider value={fake.client}>
        <AuditLog search={{ action: 'create', outcome: undefined, actor: '  ' }} onSearch={onSearch} />
      </Provider>,
    );
    await screen.findByText('createApiToken');
    expect(actions()).toEqual(['createApiToken', 'createUser', 'createNode']);
    expect(fake.sent(AuditLog_EventsQuery).map((op) => op.variables.filter)).toContainEqual({ action: 'create' });

    // Live: an event the filter leaves out stays out; one it takes goes on top.
    fake.push(AuditLog_EventAddedSubscription, { auditEventAdded: event(8, 'DONE', 'login') });
    fake.push(AuditLog_EventAddedSubscription, { auditEventAdded: event(9, 'DONE', 'createOrg') });
    await vi.waitFor(() => expect(actions()).toEqual(['createOrg', 'createApiToken', 'createUser', 'createNode']));

    const user = userEvent.setup();
    const form = screen.getByRole('form', { name: 'Filter the audit log' });
    await user.type(within(form).getByLabelText('Actor'), 'node:gpu-1');
    await user.selectOptions(within(form).getByLabelText('Outcome'), 'REFUSED');
    await user.click(within(form).getByRole('button', { name: 'Filter' }));
    expect(onSearch).toHaveBeenLastCalledWith({
      actor: 'node:gpu-1',
      action: 'create',
      target: undefined,
      outcome: 'REFUSED',
      from: undefined,
      to: undefined,
    });
    await user.click(within(form).getByRole('button', { name: 'Clear' }));
    expect(onSearch).toHaveBeenLastCalledWith({});
  });

  it('says so when the log is empty', async () => {
    const fake = fakeClient([
      answer(AuditLog_EventsQuery, () => ({
        auditEvents: {
          __typename: 'AuditEventConnection',
          edges: [],
          pageInfo: { __typename: 'PageInfo', hasNextPage: false, endCursor: null },
        },
      })),
    ]);
    render(
      <Provider value={fake.client}>
        <AuditLog />
      </Provider>,
    );
    expect(await screen.findByText(/No audit events yet/)).toBeInTheDocument();
    expect(screen.queryByRole('button', { name: 'Load more' })).toBeNull();
  });
});
