import { useSyncExternalStore } from 'react';
import { useQuery, useSubscription } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { type LiveState, live } from '../../graphql/live';
import { useRefetchOnReconnect } from '../../graphql/use-reconnect';
import { formatBytes, formatMiB, shortSha } from '../../lib/format';
import { CopyButton } from '../common/copy-button';
import { DataTable } from '../common/data-table';
import { FormError } from '../common/form-error';
import { jobBadge } from '../common/job-badge';
import { PageLink } from '../common/page-link';
import { TimeAgo } from '../common/time-ago';
import { TrainCharts } from './train-charts';
import { TrainEvaluation, TrainEvaluation_JobFragment } from './train-evaluation';
import { TrainJobActions } from './train-job-actions';
import { ownerText, TrainJob_RowFragment, TrainProgress } from './train-progress';

export type TrainJobPage_Job = ResultOf<typeof TrainJobPage_JobFragment>;

/** The whole job: the query, its subscription and the mutations on it select it, so each updates the page. */
export const TrainJobPage_JobFragment = graphql(
  `
  fragment TrainJobPage_Job on TrainJob {
    ...TrainJob_Row
    baseRepo
    baseRevision
    gpuMiB
    gguf
    params
    pairs
    dataSha256
    dataBytes
    startedAt
    finishedAt
    adapter
    ...TrainEvaluation_Job
    events {
      id
      level
      message
      at
    }
    artifacts {
      kind
      filename
      size
      sha256
      url
      files {
        name
        size
        sha256
      }
    }
  }
`,
  [TrainJob_RowFragment, TrainEvaluation_JobFragment],
);

type ParamAbout = { name: string; about: string };

export const TrainJobPage_JobQuery = graphql(
  `
  query TrainJobPage_Job($id: ID!) {
    trainJob(id: $id) {
      ...TrainJobPage_Job
    }
    trainParams {
      name
      about
    }
  }
`,
  [TrainJobPage_JobFragment],
);

export const TrainJobPage_ChangedSubscription = graphql(
  `
  subscription TrainJobPage_Changed($id: ID!) {
    trainJobChanged(id: $id) {
      ...TrainJobPage_Job
    }
  }
`,
  [TrainJobPage_JobFragment],
);

const liveText: Record<LiveState, string> = {
  connecting: 'Connecting for live updates…',
  live: 'Live: the job follows its node step by step.',
  reconnecting: 'Reconnecting: the job is re-read when the connection is back.',
  stopped: 'Live updates stopped: the server refused the connection. Sign in again to resume them.',
};

const levelClass: Record<string, string> = { info: 'muted', warn: 'warn', error: 'bad' };

/**
 * One training job, live: what it is, how far it has come, its curves, what happened, what it made, and what the
 * operator can do with it now (cancel, publish, delete). Its id is in the URL: a reload reads it again.
 */
export function TrainJobPage({ id, canChange, onDeleted }: { id: string; canChange: boolean; onDeleted: () => void }) {
  const [{ data, fetching, error }, refetch] = useQuery({
    query: TrainJobPage_JobQuery,
    variables: { id },
    requestPolicy: 'cache-and-network',
  });
  useSubscription({ query: TrainJobPage_ChangedSubscription, variables: { id } });
  const liveState = useSyncExternalStore(live.subscribe, live.get, live.get);
  useRefetchOnReconnect(refetch);
  const job = data?.trainJob;

  return (
    <section className="train-job" data-testid="train-job">
      <header className="page-header">
        <p className="crumbs">
          <PageLink to="/training">Training</PageLink> /
        </p>
        <div className="job-head">
          <h1>{job?.name ?? 'Training job'}</h1>
          {job ? jobBadge(job.state) : null}
          {job?.cancelRequested && (job.state === 'QUEUED' || job.state === 'RUNNING') ? (
            <span className="badge warn">cancelling…</span>
          ) : null}
        </div>
      </header>
      <FormError error={error} />
      {!data && fetching ? <p className="muted">Loading…</p> : null}
      {data && !job ? (
        <p className="empty">
          There is no training job {id}: it may have been deleted. <PageLink to="/training">See every job</PageLink>.
        </p>
      ) : null}
      {job ? (
        <>
          <p className="live-state" aria-live="polite">
            <span className={`dot ${liveState === 'live' ? 'ok' : 'idle'}`} aria-hidden="true" />
            {liveText[liveState]}
          </p>
          <JobFacts job={job} />
          {job.message ? (
            <p
              role="status"
              className={`job-message ${job.state === 'FAILED' ? 'form-error' : job.state === 'DONE' ? 'notice' : 'muted'}`}
            >
              {job.message}
            </p>
          ) : null}
          {canChange ? <TrainJobActions job={job} onDeleted={onDeleted} /> : null}
          {!canChange && job.adapter ? (
            <p className="notice">
              Published as {job.adapter}: <PageLink to="/models">see it on the Models page</PageLink>.
            </p>
          ) : null}
          <section className="panel train-progress" aria-label="Progress">
            <TrainProgress job={job} />
          </section>
          <TrainCharts id={job.id} gpuMiB={job.gpuMiB} />
          <TrainEvaluation job={job} />
          <div className="train-columns">
            <Events job={job} />
            <div className="train-side">
              <Params params={job.params} about={data?.trainParams ?? []} />
              <Data job={job} />
            </div>
          </div>
          <Artifacts job={job} />
        </>
      ) : null}
    </section>
  );
}

function JobFacts({ job }: { job: TrainJobPage_Job }) {
  return (
    <dl className="facts" aria-label="The job">
      <div>
        <dt>Model</dt>
        <dd>
          <PageLink to="/models">{job.model}</PageLink>
        </dd>
      </div>
      <div>
        <dt>Node</dt>
        <dd>{job.node ? <PageLink to="/nodes">{job.node.name}</PageLink> : <span className="muted">removed</span>}</dd>
      </div>
      <div>
        <dt>GPU memory</dt>
        <dd>{formatMiB(job.gpuMiB)}</dd>
      </div>
      <div>
        <dt>Owner</dt>
        <dd className="mono">{ownerText(job)}</dd>
      </div>
      <div>
        <dt>Base weights</dt>
        <dd className="mono">
          {job.baseRepo}
          {job.baseRevision ? <span className="muted">@{job.baseRevision}</span> : null}
        </dd>
      </div>
      <div>
        <dt>GGUF adapter</dt>
        <dd>{job.gguf ? 'made for llama.cpp' : 'not made'}</dd>
      </div>
      <div>
        <dt>Created</dt>
        <dd>
          <TimeAgo at={job.createdAt} />
          {job.createdBy ? <span className="muted"> by {job.createdBy}</span> : null}
        </dd>
      </div>
      <div>
        <dt>Started</dt>
        <dd>
          <TimeAgo at={job.startedAt} empty="not yet" />
        </dd>
      </div>
      <div>
        <dt>Ended</dt>
        <dd>
          <TimeAgo at={job.finishedAt} empty="not yet" />
        </dd>
      </div>
    </dl>
  );
}

function Events({ job }: { job: TrainJobPage_Job }) {
  return (
    <section className="panel train-events" aria-labelledby="train-events-title">
      <h2 id="train-events-title">Events</h2>
      {job.events.length === 0 ? (
        <p className="muted">Nothing has happened yet.</p>
      ) : (
        <div className="events-scroll">
          <DataTable wrap={false} className="dense" columns={['Time', 'Level', 'Message']}>
            <tbody>
              {job.events.map((e) => (
                <tr key={e.id}>
                  <td className="nowrap">
                    <TimeAgo at={e.at} />
                  </td>
                  <td>
                    <span className={`badge ${levelClass[e.level] ?? ''}`}>{e.level}</span>
                  </td>
                  <td className="message">{e.message}</td>
                </tr>
              ))}
            </tbody>
          </DataTable>
        </div>
      )}
    </section>
  );
}

function Params({ params: json, about }: { params: TrainJobPage_Job['params']; about: ParamAbout[] }) {
  // A JSON scalar: the server sends the trainer settings as one object of numbers.
  const params = (json ?? {}) as Record<string, unknown>;
  // In the order the server lists its settings; anything else the job holds after them.
  const known = about.map((p) => p.name);
  const names = [...known.filter((n) => n in params), ...Object.keys(params).filter((n) => !known.includes(n))];
  return (
    <section className="panel" aria-labelledby="train-params-title">
      <h2 id="train-params-title">Trainer settings</h2>
      <table className="table dense params">
        <tbody>
          {names.map((n) => (
            <tr key={n}>
              <th scope="row" className="mono">
                {n}
              </th>
              <td className="num mono">{String(params[n])}</td>
              <td className="muted">{about.find((p) => p.name === n)?.about ?? ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

function Data({ job }: { job: TrainJobPage_Job }) {
  return (
    <section className="panel" aria-labelledby="train-data-title">
      <h2 id="train-data-title">Pairs</h2>
      <dl className="facts plain-facts">
        <div>
          <dt>Pairs</dt>
          <dd>{job.pairs.toLocaleString('en')}</dd>
        </div>
        <div>
          <dt>Size</dt>
          <dd>{formatBytes(job.dataBytes)}</dd>
        </div>
        <div className="grow">
          <dt>sha256</dt>
          <dd className="url-line">
            <code className="url">{job.dataSha256}</code>
            <CopyButton text={job.dataSha256} label="Copy" />
          </dd>
        </div>
      </dl>
    </section>
  );
}

function Artifacts({ job }: { job: TrainJobPage_Job }) {
  return (
    <section className="panel" aria-labelledby="train-artifacts-title">
      <h2 id="train-artifacts-title">Artifacts</h2>
      {job.artifacts.length === 0 ? (
        <p className="muted">
          {job.state === 'DONE' || job.state === 'RUNNING'
            ? 'Nothing uploaded yet: the node uploads the adapter when the trainer has finished.'
            : job.state === 'QUEUED'
              ? 'The adapter is uploaded here once the job has run.'
              : 'The job made nothing.'}
        </p>
      ) : (
        <DataTable
          className="artifacts"
          columns={['Kind', 'File', { label: 'Size', className: 'num' }, 'sha256', { label: 'Download', hidden: true }]}
        >
          <tbody>
            {job.artifacts.map((a) => (
              <tr key={a.kind}>
                <td>
                  <span className="badge muted">{a.kind}</span>
                </td>
                <th scope="row" className="mono">
                  {a.filename}
                  {a.files.length ? <div className="sub">{a.files.map((f) => f.name).join(', ')}</div> : null}
                </th>
                <td className="num">{formatBytes(a.size)}</td>
                <td>
                  <span className="digest">
                    <code title={a.sha256}>{shortSha(a.sha256)}</code>
                    <CopyButton text={a.sha256} label="Copy" />
                  </span>
                </td>
                <td className="actions">
                  <a className="button small" href={a.url} download={a.filename}>
                    Download
                  </a>
                </td>
              </tr>
            ))}
          </tbody>
        </DataTable>
      )}
    </section>
  );
}
