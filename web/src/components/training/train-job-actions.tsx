import { useState } from 'react';
import { type CombinedError, useMutation } from 'urql';
import { type Answer, graphql } from '../../graphql/graphql';
import type { Outcome, Refusal } from '../../graphql/types';
import { isRefusal } from '../../graphql/types';
import { ConfirmDialog, InlineConfirm } from '../common/confirm-dialog';
import { FormError, FormError_RefusalFragment } from '../common/form-error';
import { ConfirmButton, DangerButton } from '../common/form-parts';
import { PageLink } from '../common/page-link';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import type { TrainJobPage_Job } from './train-job-page';

/**
 * The answer is the job: a queued one cancelled, or a running one marked cancelling; its row and page update by
 * id. Its `message` comes aliased: it may be null where a refusal's may not, and GraphQL refuses the two under one
 * name in one answer (graphcache stores it as the job's `message` all the same).
 */
export const TrainJobActions_CancelMutation = graphql(
  `
  mutation TrainJobActions_Cancel($id: ID!) {
    cancelTrainJob(id: $id) {
      __typename
      ... on TrainJob {
        id
        state
        cancelRequested
        jobMessage: message
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/** graphcache's updater (graphql/cache.ts) takes the job out of the training list. */
export const TrainJobActions_DeleteMutation = graphql(
  `
  mutation TrainJobActions_Delete($id: ID!) {
    deleteTrainJob(id: $id) {
      __typename
      ... on DeletedTrainJob {
        id
        name
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

export type Published = Answer<typeof TrainJobActions_PublishMutation, 'publishTrainJob', 'TrainJobPublished'>;

/** The answer names no job: graphcache's updater reads the job's adapter and the catalog's models again. */
export const TrainJobActions_PublishMutation = graphql(
  `
  mutation TrainJobActions_Publish($id: ID!, $force: Boolean, $reason: String) {
    publishTrainJob(id: $id, force: $force, reason: $reason) {
      __typename
      ... on TrainJobPublished {
        adapter
        model
        source
        owner
        note
        liveWithoutRestart
      }
      ...FormError_Refusal
    }
  }
`,
  [FormError_RefusalFragment],
);

/**
 * What the operator can do with the job now: cancel it while it is queued or running (a running one stops once its
 * node has stopped the trainer: "cancelling…" until then), publish a finished one's adapter, delete an ended one.
 */
export function TrainJobActions({ job, onDeleted }: { job: TrainJobPage_Job; onDeleted: () => void }) {
  const [cancelState, cancel] = useMutation(TrainJobActions_CancelMutation);
  const [publishState, publish] = useMutation(TrainJobActions_PublishMutation);
  const [problem, setProblem] = useState<{ refusal?: Refusal; error?: CombinedError }>();
  const [published, setPublished] = useState<Published>();
  const [confirming, setConfirming] = useState(false);
  // A running job's hours of GPU time are lost by a cancel: asked first, as every action that cannot be undone is.
  const [cancelling, setCancelling] = useState(false);
  const [reason, setReason] = useState('');
  const active = job.state === 'QUEUED' || job.state === 'RUNNING';

  const report = <T extends { __typename: string }>(outcome: Outcome<T> | undefined, error?: CombinedError) => {
    if (isRefusal(outcome)) setProblem({ refusal: outcome });
    else if (error) setProblem({ error });
    return !isRefusal(outcome) && !error ? outcome : undefined;
  };
  const onCancel = async () => {
    setProblem(undefined);
    const result = await cancel({ id: job.id });
    report(result.data?.cancelTrainJob, result.error);
  };
  const onPublish = async (force = false) => {
    setProblem(undefined);
    const result = await publish(force ? { id: job.id, force: true, reason } : { id: job.id });
    const answer = report(result.data?.publishTrainJob, result.error);
    if (answer?.__typename === 'TrainJobPublished') setPublished(answer);
  };

  return (
    <div className="train-actions">
      <div className="model-actions">
        {active && !job.cancelRequested ? (
          <button
            type="button"
            className="button small"
            disabled={cancelState.fetching}
            title={job.state === 'RUNNING' ? 'The node stops the trainer; the job ends once it has exited' : undefined}
            onClick={() => setCancelling(true)}
          >
            Cancel
          </button>
        ) : null}
        {active && job.cancelRequested ? <span className="muted">cancelling…</span> : null}
        {job.state === 'DONE' && !job.adapter && !published ? (
          <button
            type="button"
            className="button small primary"
            disabled={publishState.fetching}
            onClick={() => onPublish()}
          >
            Publish
          </button>
        ) : null}
        {!active ? <ConfirmButton onClick={() => setConfirming(true)}>Delete</ConfirmButton> : null}
      </div>
      {cancelling && active && !job.cancelRequested ? (
        <InlineConfirm
          label={`Cancel ${job.name}`}
          action={`Cancel ${job.name}`}
          busy={cancelState.fetching}
          onConfirm={async () => {
            await onCancel();
            setCancelling(false);
          }}
          onKeep={() => setCancelling(false)}
        >
          <p>
            {job.state === 'RUNNING'
              ? `Its node stops the trainer at once: the steps trained so far (${job.step} of ${job.steps}) are lost and no adapter is made.`
              : 'It leaves the queue before any node takes it.'}
          </p>
        </InlineConfirm>
      ) : null}
      {/* The answer, with what to do next, once; after a reload the job's adapter says it was published. */}
      {published ? (
        <div role="status" className="notice publish-answer">
          <p>
            Published as {job.model}'s adapter <strong>{published.adapter}</strong>:{' '}
            <PageLink to="/models">see it under {job.model} on the Models page</PageLink>.
          </p>
          <p>{published.note}</p>
          {/* The one action that makes it live: with replicas that load adapters as they run, nothing is restarted;
              what is left is to call it, in the model's playground with the adapter chosen. */}
          {published.liveWithoutRestart ? (
            <p>
              <PageLink
                to={`/models/${encodeURIComponent(published.model)}?call=${encodeURIComponent(published.adapter)}`}
                className="button small primary"
              >
                Try {published.adapter} in the playground
              </PageLink>
            </p>
          ) : null}
          <p className="url-line">
            <span className="muted">Nodes fetch it from</span> <code className="url">{published.source}</code>
          </p>
        </div>
      ) : job.adapter ? (
        <p className="notice">
          Published as <strong>{job.adapter}</strong>:{' '}
          <PageLink to="/models">see it under {job.model} on the Models page</PageLink>.
        </p>
      ) : null}
      <FormError refusal={problem?.refusal} error={problem?.error} />
      {/* Refused for its evaluation: the way past it is labelled, and needs a reason the audit log keeps. */}
      {problem?.refusal && /WORSE/.test(problem.refusal.message) && !published ? (
        <details className="fetch-anyway">
          <summary>Publish anyway…</summary>
          <label className="field">
            <span>Why (kept in the audit log with the evaluation)</span>
            <input value={reason} onChange={(e) => setReason(e.target.value)} />
          </label>
          <button
            type="button"
            className="button small danger"
            disabled={publishState.fetching || !reason.trim()}
            onClick={() => onPublish(true)}
          >
            Publish {job.name} although it is worse
          </button>
        </details>
      ) : null}
      {confirming ? <DeleteJob job={job} onClose={() => setConfirming(false)} onDeleted={onDeleted} /> : null}
    </div>
  );
}

function DeleteJob({ job, onClose, onDeleted }: { job: TrainJobPage_Job; onClose: () => void; onDeleted: () => void }) {
  const { fetching, error, refusal, run } = useRefusableMutation(
    TrainJobActions_DeleteMutation,
    (d) => d.deleteTrainJob,
  );

  const confirm = async () => {
    const outcome = await run({ id: job.id });
    if (outcome?.__typename === 'DeletedTrainJob') onDeleted();
  };

  return (
    <ConfirmDialog
      title={`Delete the job ${job.name}?`}
      refusal={refusal}
      error={error}
      onClose={onClose}
      actions={
        <DangerButton busy={fetching} onClick={confirm}>
          Delete {job.name}
        </DangerButton>
      }
    >
      Its curve, events and artifacts are deleted, and its pairs unless another job uses them.
      {job.adapter ? ` The published adapter ${job.adapter} stays in the catalog.` : ''}
    </ConfirmDialog>
  );
}
