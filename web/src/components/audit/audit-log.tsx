import { type FormEvent, useState, useSyncExternalStore } from 'react';
import { useSubscription } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { type LiveState, live } from '../../graphql/live';
import type { AuditOutcome } from '../../graphql/types';
import { Breakable } from '../common/breakable';
import { DataTable, TableStateRows } from '../common/data-table';
import { describeError } from '../common/form-error';
import { PageHeader } from '../common/page';
import { TimeAgo } from '../common/time-ago';
import { usePageQuery } from '../common/use-page-query';
import { type AuditSearch, auditFilterOf, auditOutcomes } from './audit-filter';

export const AuditLog_EventFragment = graphql(`
  fragment AuditLog_Event on AuditEvent {
    id
    at
    actor
    action
    target
    outcome
    message
    requestId
    ownerName
  }
`);

/** One event as the table shows it, typed from the fragment (gql.tada, from server/schema.graphql). */
export type AuditEventRow = ResultOf<typeof AuditLog_EventFragment>;

export const AuditLog_EventsQuery = graphql(
  `
  query AuditLog_Events($first: Int!, $after: String, $filter: AuditFilter) {
    auditEvents(first: $first, after: $after, filter: $filter) {
      # Named, so the live updater (graphql/cache.ts) can write an edge of its own typed like these.
      edges {
        __typename
        cursor
        node {
          ...AuditLog_Event
        }
      }
      pageInfo {
        hasNextPage
        endCursor
      }
    }
  }
`,
  [AuditLog_EventFragment],
);

/** Each committed event; graphcache's updater (graphql/cache.ts) puts it on top of the first page. */
export const AuditLog_EventAddedSubscription = graphql(
  `
  subscription AuditLog_EventAdded {
    auditEventAdded {
      ...AuditLog_Event
    }
  }
`,
  [AuditLog_EventFragment],
);

export const AUDIT_PAGE_SIZE = 50;

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: new events appear at the top.',
  reconnecting: 'Reconnecting: the list is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

/**
 * The audit log, newest first: one query per page (cursor after the previous page's end), so events that arrive
 * live join the first page without shifting the later ones.
 */
export function AuditLog({
  pageSize = AUDIT_PAGE_SIZE,
  search = {},
  onSearch,
}: {
  pageSize?: number;
  search?: AuditSearch;
  onSearch?: (next: AuditSearch) => void;
}) {
  const filter = auditFilterOf(search);
  const filterKey = JSON.stringify(filter);
  return (
    <section>
      <PageHeader title="Audit">
        Every mutation, done or refused: who asked, what, on what, and how it ended.
      </PageHeader>
      {onSearch ? <AuditFilterForm key={`form ${filterKey}`} search={search} onSearch={onSearch} /> : null}
      {/* A new filter starts again from its first page. */}
      <AuditTable key={`table ${filterKey}`} pageSize={pageSize} filter={filter} />
    </section>
  );
}

function AuditTable({ pageSize, filter }: { pageSize: number; filter: AuditSearch | null }) {
  const [cursors, setCursors] = useState<(string | null)[]>([null]);
  useSubscription({ query: AuditLog_EventAddedSubscription });
  const state = useSyncExternalStore(live.subscribe, live.get, live.get);
  return (
    <>
      <p className="live-state" aria-live="polite">
        <span className={`dot ${state === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
        {liveText[state]}
        {filter ? ' Only events that match the filter are listed.' : ''}
      </p>
      <DataTable
        className="dense audit stack-narrow"
        columns={['Time', 'Actor', 'Action', 'Target', 'Outcome', 'Message']}
      >
        {cursors.map((after, i) => (
          <AuditPage
            key={after ?? 'first'}
            first={pageSize}
            after={after}
            filter={filter}
            onLoadMore={i === cursors.length - 1 ? (end) => setCursors((c) => [...c, end]) : undefined}
          />
        ))}
      </DataTable>
    </>
  );
}

/** datetime-local speaks the browser's time zone without one; the URL and the server speak UTC. */
const toLocalInput = (iso?: string) => {
  if (!iso) return '';
  const d = new Date(iso);
  return new Date(d.getTime() - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
};
const fromLocalInput = (value: FormDataEntryValue | null) => {
  const text = String(value ?? '');
  const at = text ? new Date(text) : undefined;
  return at && !Number.isNaN(at.getTime()) ? at.toISOString() : undefined;
};

function AuditFilterForm({ search, onSearch }: { search: AuditSearch; onSearch: (next: AuditSearch) => void }) {
  const submit = (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    const text = (name: string) => String(form.get(name) ?? '').trim() || undefined;
    const outcome = text('outcome') as AuditSearch['outcome'];
    onSearch({
      actor: text('actor'),
      action: text('action'),
      target: text('target'),
      outcome,
      from: fromLocalInput(form.get('from')),
      to: fromLocalInput(form.get('to')),
    });
  };
  const filtered = auditFilterOf(search) !== null;
  return (
    <form className="form-row audit-filter" aria-label="Filter the audit log" onSubmit={submit}>
      <label className="field">
        <span>Actor</span>
        <input name="actor" defaultValue={search.actor ?? ''} placeholder="user:ops@, node:gpu-1" />
      </label>
      <label className="field">
        <span>Action</span>
        <input name="action" defaultValue={search.action ?? ''} placeholder="login, createNode" />
      </label>
      <label className="field">
        <span>Target</span>
        <input name="target" defaultValue={search.target ?? ''} />
      </label>
      <label className="field">
        <span>Outcome</span>
        <select name="outcome" defaultValue={search.outcome ?? ''}>
          <option value="">any</option>
          {auditOutcomes.map((o) => (
            <option key={o} value={o}>
              {o}
            </option>
          ))}
        </select>
      </label>
      <label className="field">
        <span>From</span>
        <input name="from" type="datetime-local" defaultValue={toLocalInput(search.from)} />
      </label>
      <label className="field">
        <span>To</span>
        <input name="to" type="datetime-local" defaultValue={toLocalInput(search.to)} />
      </label>
      <button type="submit" className="button primary">
        Filter
      </button>
      {filtered ? (
        <button type="button" className="button" onClick={() => onSearch({})}>
          Clear
        </button>
      ) : null}
    </form>
  );
}

function AuditPage({
  first,
  after,
  filter,
  onLoadMore,
}: {
  first: number;
  after: string | null;
  filter: AuditSearch | null;
  onLoadMore?: (endCursor: string) => void;
}) {
  const { data, fetching, error } = usePageQuery(AuditLog_EventsQuery, { first, after, filter });

  const edges = data?.auditEvents.edges ?? [];
  const pageInfo = data?.auditEvents.pageInfo;
  return (
    <tbody>
      {edges.map(({ node }) => (
        <AuditRow key={node.id} event={node} />
      ))}
      <TableStateRows
        columns={6}
        problem={describeError(error)}
        loading={!data && fetching}
        empty={
          data && after === null && edges.length === 0
            ? filter
              ? 'No audit event matches this filter.'
              : 'No audit events yet. Every sign-in, change and refusal will be listed here.'
            : null
        }
        pageInfo={pageInfo}
        onLoadMore={onLoadMore}
      />
    </tbody>
  );
}

const outcomeClass: Record<AuditOutcome, string> = { DONE: 'ok', REFUSED: 'warn', FAILED: 'bad' };

function AuditRow({ event }: { event: AuditEventRow }) {
  return (
    <tr>
      <td className="nowrap" data-label="Time">
        <TimeAgo at={event.at} />
      </td>
      <td className="mono" data-label="Actor">
        <Breakable text={event.actor} />
      </td>
      <td className="mono nowrap" data-label="Action">
        {event.action}
      </td>
      <td className="mono" data-label="Target">
        {event.target ? <Breakable text={event.target} /> : <span className="muted">—</span>}
        {/* The owner of what the row is about, by name (team:acme/support), as every page shows owners. */}
        {event.ownerName ? (
          <span className="muted audit-owner">
            {' '}
            · <Breakable text={event.ownerName} />
          </span>
        ) : null}
      </td>
      <td data-label="Outcome">
        <span className={`badge ${outcomeClass[event.outcome] ?? ''}`}>{event.outcome}</span>
      </td>
      <td
        className="message wide"
        data-label="Message"
        title={event.requestId ? `request ${event.requestId}` : undefined}
      >
        {event.message ?? ''}
      </td>
    </tr>
  );
}
