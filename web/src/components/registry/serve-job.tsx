import { useQuery, useSubscription } from 'urql';
import { graphql, type ResultOf } from '../../graphql/graphql';
import { FormError } from '../common/form-error';
import { jobBadge } from '../common/job-badge';
import { PageLink } from '../common/page-link';

export type ServeJob_Job = ResultOf<typeof ServeJob_JobFragment>;

/** The whole job: the mutation, the query and each subscription event select it, so graphcache updates it by id. */
export const ServeJob_JobFragment = graphql(`
  fragment ServeJob_Job on ServeJob {
    id
    repo
    quant
    file
    onDemand
    state
    message
    createdBy
    createdAt
    finishedAt
    steps {
      id
      name
      state
      message
      startedAt
      finishedAt
    }
  }
`);

/** The job as it is now: after a reload, or when its events came before the subscription opened. */
export const ServeJob_JobQuery = graphql(
  `
  query ServeJob_Job($id: ID!) {
    serveJob(id: $id) {
      ...ServeJob_Job
    }
  }
`,
  [ServeJob_JobFragment],
);

export const ServeJob_ChangedSubscription = graphql(
  `
  subscription ServeJob_Changed($id: ID!) {
    serveJobChanged(id: $id) {
      ...ServeJob_Job
    }
  }
`,
  [ServeJob_JobFragment],
);

/**
 * A serve job, live: registry → mirror → check → catalog → replica → smoke, each step with its state and the
 * server's message, then the job's own last word ('answered " Hello" at 12.0 tokens/s', or why it failed).
 * Its id is in the URL, so a reload reads the job again and subscribes anew.
 */
export function ServeJob({ id, onClose }: { id: string; onClose?: () => void }) {
  const [{ data, fetching, error }] = useQuery({
    query: ServeJob_JobQuery,
    variables: { id },
    requestPolicy: 'cache-and-network',
  });
  useSubscription({ query: ServeJob_ChangedSubscription, variables: { id } });
  const job = data?.serveJob;
  const what = job ? `${job.repo}${job.quant ? ` ${job.quant}` : job.file ? ` ${job.file}` : ''}` : '';

  return (
    <section className="serve-job" aria-label="Serve job" data-testid={`job-${id}`}>
      <div className="repo-head">
        <h4 className="job-title">Serving {what || 'from the registry'}</h4>
        {job ? jobBadge(job.state) : null}
        {job?.onDemand ? <span className="muted">on demand</span> : null}
        {onClose ? (
          <button type="button" className="button small close" onClick={onClose}>
            Close
          </button>
        ) : null}
      </div>
      <FormError error={error} />
      {!job && fetching ? <p className="muted">Reading the job…</p> : null}
      {data && !job ? <p className="form-error">The server has no serve job {id}.</p> : null}
      {job ? (
        <>
          <ol className="job-steps" aria-label="Steps">
            {job.steps.map((s) => (
              <li key={s.id} className="job-step" data-step={s.name}>
                <span className="step-name">{s.name}</span>
                {jobBadge(s.state)}
                {s.message ? <span className={s.state === 'FAILED' ? 'form-error' : 'muted'}>{s.message}</span> : null}
              </li>
            ))}
          </ol>
          {job.message ? (
            <p role="status" className={`job-message ${job.state === 'FAILED' ? 'form-error' : 'notice'}`}>
              {job.message}
            </p>
          ) : null}
          {job.state === 'DONE' ? <PageLink to="/models">See it on the Models page</PageLink> : null}
        </>
      ) : null}
    </section>
  );
}
