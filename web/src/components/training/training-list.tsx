import { useId, useState, useSyncExternalStore } from 'react';
import { useSubscription } from 'urql';
import { graphql } from '../../graphql/graphql';
import { type LiveState, live } from '../../graphql/live';
import { type JobState, jobStates } from '../../graphql/types';
import { DataTable, TableStateRows } from '../common/data-table';
import { describeError } from '../common/form-error';
import { jobBadge } from '../common/job-badge';
import { PageHeader } from '../common/page';
import { PageLink } from '../common/page-link';
import { TimeAgo } from '../common/time-ago';
import { usePageQuery } from '../common/use-page-query';
import { ownerText, type TrainJob_Row, TrainJob_RowFragment, TrainProgress } from './train-progress';

export const TrainingList_JobsQuery = graphql(
  `
  query TrainingList_Jobs($state: JobState, $first: Int!, $after: String) {
    trainJobs(state: $state, first: $first, after: $after) {
      edges {
        cursor
        node {
          ...TrainJob_Row
        }
      }
      pageInfo {
        hasNextPage
        endCursor
      }
    }
  }
`,
  [TrainJob_RowFragment],
);

/**
 * Every job, whole, each time it changes: rows update by id, and graphcache's updater (graphql/cache.ts) puts a
 * new job in the first page and takes one out of a list filtered to a state it has left.
 */
export const TrainingList_ChangedSubscription = graphql(
  `
  subscription TrainingList_Changed {
    trainJobChanged {
      ...TrainJob_Row
    }
  }
`,
  [TrainJob_RowFragment],
);

export const TRAIN_PAGE_SIZE = 50;
const COLUMNS = 7;

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: rows follow their jobs step by step.',
  reconnecting: 'Reconnecting: the list is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

export function TrainingList({
  state,
  onStateChange,
  canChange,
  pageSize = TRAIN_PAGE_SIZE,
}: {
  /** Only the jobs in this state; kept in the URL by the route (?state=RUNNING). */
  state?: JobState;
  onStateChange: (state: JobState | undefined) => void;
  canChange: boolean;
  pageSize?: number;
}) {
  const [cursors, setCursors] = useState<(string | null)[]>([null]);
  // A new filter starts again at its first page.
  const [shownFor, setShownFor] = useState(state);
  if (shownFor !== state) {
    setShownFor(state);
    setCursors([null]);
  }
  useSubscription({ query: TrainingList_ChangedSubscription });
  const liveState = useSyncExternalStore(live.subscribe, live.get, live.get);
  const filterId = useId();

  return (
    <section>
      <PageHeader title="Training">
        LoRA adapters trained on the fleet's GPUs from question/answer pairs: each job's progress and loss, and the
        adapter it publishes for a catalog model.
      </PageHeader>
      <div className="toolbar">
        <p className="live-state" aria-live="polite">
          <span className={`dot ${liveState === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
          {liveText[liveState]}
        </p>
        <div className="toolbar-actions">
          <div className="inline-field">
            <label htmlFor={filterId}>State</label>
            <select
              id={filterId}
              value={state ?? ''}
              onChange={(e) => onStateChange((e.target.value || undefined) as JobState | undefined)}
            >
              <option value="">every state</option>
              {jobStates.map((s) => (
                <option key={s} value={s}>
                  {s.toLowerCase()}
                </option>
              ))}
            </select>
          </div>
          {canChange ? (
            <PageLink to="/training/new" className="button primary">
              New job
            </PageLink>
          ) : null}
        </div>
      </div>
      <DataTable className="training" columns={['Name', 'Model', 'Node', 'Owner', 'State', 'Progress', 'Created']}>
        {cursors.map((after, i) => (
          <JobsPage
            key={`${state ?? 'all'}:${after ?? 'first'}`}
            state={state ?? null}
            first={pageSize}
            after={after}
            canChange={canChange}
            onShowAll={state ? () => onStateChange(undefined) : undefined}
            onLoadMore={i === cursors.length - 1 ? (end) => setCursors((c) => [...c, end]) : undefined}
          />
        ))}
      </DataTable>
    </section>
  );
}

function JobsPage({
  state,
  first,
  after,
  canChange,
  onShowAll,
  onLoadMore,
}: {
  state: JobState | null;
  first: number;
  after: string | null;
  canChange: boolean;
  onShowAll?: () => void;
  onLoadMore?: (endCursor: string) => void;
}) {
  const { data, fetching, error } = usePageQuery(TrainingList_JobsQuery, { state, first, after });

  const edges = data?.trainJobs.edges ?? [];
  const pageInfo = data?.trainJobs.pageInfo;
  return (
    <tbody>
      {edges.map(({ node }) => (
        <JobRow key={node.id} job={node} />
      ))}
      <TableStateRows
        columns={COLUMNS}
        problem={describeError(error)}
        loading={!data && fetching}
        empty={
          data && after === null && edges.length === 0 ? (
            state ? (
              <>
                No {state.toLowerCase()} jobs.{' '}
                {onShowAll ? (
                  <button type="button" className="link-button" onClick={onShowAll}>
                    Show every state
                  </button>
                ) : null}
              </>
            ) : (
              <EmptyTraining canChange={canChange} />
            )
          ) : null
        }
        pageInfo={pageInfo}
        onLoadMore={onLoadMore}
      />
    </tbody>
  );
}

function EmptyTraining({ canChange }: { canChange: boolean }) {
  return (
    <div className="empty-training">
      <p>No training jobs yet.</p>
      <p>
        A job teaches a catalog model a LoRA adapter: you give it question/answer pairs (a .jsonl file, one{' '}
        <code>{'{"q": "…", "a": "…"}'}</code> per line), the model's base weights on the registry and a node with a free
        GPU; the node trains it, and once it is done you publish the adapter, which requests then ask for by its name.
      </p>
      <p>
        {canChange ? (
          <>
            Start one with <PageLink to="/training/new">New job</PageLink>.
          </>
        ) : (
          'An operator starts them.'
        )}
      </p>
    </div>
  );
}

function JobRow({ job }: { job: TrainJob_Row }) {
  const ended = job.state === 'DONE' || job.state === 'FAILED' || job.state === 'CANCELLED';
  return (
    <tr data-testid={`train-job-${job.name}`} className={`train-job state-${job.state.toLowerCase()}`}>
      <th scope="row">
        <PageLink to={`/training/${job.id}`}>{job.name}</PageLink>
      </th>
      <td>{job.model}</td>
      <td>{job.node?.name ?? <span className="muted">removed</span>}</td>
      <td className="mono">{ownerText(job)}</td>
      <td>
        <div className="states">
          {jobBadge(job.state)}
          {job.cancelRequested && !ended ? <span className="badge warn">cancelling…</span> : null}
        </div>
      </td>
      <td className="progress-cell">
        <TrainProgress job={job} />
        {job.message && job.state !== 'DONE' ? (
          <div className={`sub job-line${job.state === 'FAILED' ? ' form-error' : ''}`}>{job.message}</div>
        ) : null}
      </td>
      <td>
        <TimeAgo at={job.createdAt} />
        {job.createdBy ? <div className="sub">by {job.createdBy}</div> : null}
      </td>
    </tr>
  );
}
