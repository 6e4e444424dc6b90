import { useState, useSyncExternalStore } from 'react';
import { gql, useQuery, useSubscription } from 'urql';
import { type LiveState, live } from '../../graphql/live';
import type { AuditOutcome } from '../../graphql/types';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { describeError } from '../common/form-error';
import { LoadMoreRow } from '../common/load-more-row';
import { PageHeader } from '../common/page';
import { TimeAgo } from '../common/time-ago';

export type AuditEventRow = {
  __typename?: 'AuditEvent';
  id: string;
  at: string;
  actor: string;
  action: string;
  target: string | null;
  outcome: AuditOutcome;
  message: string | null;
  requestId: string | null;
};

export const AuditLog_EventFragment = gql<AuditEventRow>`
  fragment AuditLog_Event on AuditEvent {
    id
    at
    actor
    action
    target
    outcome
    message
    requestId
  }
`;

type EventsPage = {
  auditEvents: {
    edges: { __typename?: 'AuditEventEdge'; cursor: string; node: AuditEventRow }[];
    pageInfo: { hasNextPage: boolean; endCursor: string | null };
  };
};

export const AuditLog_EventsQuery = gql<EventsPage, { first: number; after: string | null }>`
  query AuditLog_Events($first: Int!, $after: String) {
    auditEvents(first: $first, after: $after) {
      edges {
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
  ${AuditLog_EventFragment}
`;

/** Each committed event; graphcache's updater (graphql/cache.ts) puts it on top of the first page. */
export const AuditLog_EventAddedSubscription = gql<{ auditEventAdded: AuditEventRow }>`
  subscription AuditLog_EventAdded {
    auditEventAdded {
      ...AuditLog_Event
    }
  }
  ${AuditLog_EventFragment}
`;

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
export function AuditLog({ pageSize = AUDIT_PAGE_SIZE }: { pageSize?: number }) {
  const [cursors, setCursors] = useState<(string | null)[]>([null]);
  useSubscription({ query: AuditLog_EventAddedSubscription });
  const state = useSyncExternalStore(live.subscribe, live.get, live.get);

  return (
    <section>
      <PageHeader title="Audit">
        Every mutation, done or refused: who asked, what, on what, and how it ended.
      </PageHeader>
      <p className="live-state" aria-live="polite">
        <span className={`dot ${state === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
        {liveText[state]}
      </p>
      <div className="table-wrap">
        <table className="table dense audit">
          <thead>
            <tr>
              <th scope="col">Time</th>
              <th scope="col">Actor</th>
              <th scope="col">Action</th>
              <th scope="col">Target</th>
              <th scope="col">Outcome</th>
              <th scope="col">Message</th>
            </tr>
          </thead>
          {cursors.map((after, i) => (
            <AuditPage
              key={after ?? 'first'}
              first={pageSize}
              after={after}
              onLoadMore={i === cursors.length - 1 ? (end) => setCursors((c) => [...c, end]) : undefined}
            />
          ))}
        </table>
      </div>
    </section>
  );
}

function AuditPage({
  first,
  after,
  onLoadMore,
}: {
  first: number;
  after: string | null;
  onLoadMore?: (endCursor: string) => void;
}) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: AuditLog_EventsQuery,
    variables: { first, after },
    // The first page is re-read on every visit: events may have happened while the page was closed.
    requestPolicy: after === null ? 'cache-and-network' : 'cache-first',
  });
  useRefetchOnReconnect(refetch, after === null);

  const edges = data?.auditEvents.edges ?? [];
  const pageInfo = data?.auditEvents.pageInfo;
  return (
    <tbody>
      {edges.map(({ node }) => (
        <AuditRow key={node.id} event={node} />
      ))}
      {error ? (
        <tr>
          <td colSpan={6} role="alert" className="form-error">
            {describeError(error)}
          </td>
        </tr>
      ) : null}
      {!data && fetching ? (
        <tr>
          <td colSpan={6} className="muted">
            Loading…
          </td>
        </tr>
      ) : null}
      {data && after === null && edges.length === 0 ? (
        <tr>
          <td colSpan={6} className="empty">
            No audit events yet. Every sign-in, change and refusal will be listed here.
          </td>
        </tr>
      ) : null}
      <LoadMoreRow
        columns={6}
        hasNextPage={pageInfo?.hasNextPage}
        endCursor={pageInfo?.endCursor}
        onLoadMore={onLoadMore}
      />
    </tbody>
  );
}

const outcomeClass: Record<AuditOutcome, string> = { DONE: 'ok', REFUSED: 'warn', FAILED: 'bad' };

function AuditRow({ event }: { event: AuditEventRow }) {
  return (
    <tr>
      <td className="nowrap">
        <TimeAgo at={event.at} />
      </td>
      <td className="mono">{event.actor}</td>
      <td className="mono nowrap">{event.action}</td>
      <td className="mono">{event.target ?? <span className="muted">—</span>}</td>
      <td>
        <span className={`badge ${outcomeClass[event.outcome] ?? ''}`}>{event.outcome}</span>
      </td>
      <td className="message" title={event.requestId ? `request ${event.requestId}` : undefined}>
        {event.message ?? ''}
      </td>
    </tr>
  );
}
