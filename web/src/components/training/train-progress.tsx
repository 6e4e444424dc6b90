import { graphql, type ResultOf } from '../../graphql/graphql';
import { formatMiB } from '../../lib/format';

export type TrainJob_Row = ResultOf<typeof TrainJob_RowFragment>;

/**
 * A job as the list shows it. The list, its subscription, the job page and every mutation that answers with a job
 * select it, so graphcache updates the row by id wherever it is shown.
 */
export const TrainJob_RowFragment = graphql(`
  fragment TrainJob_Row on TrainJob {
    id
    name
    model
    node {
      id
      name
    }
    owner
    ownerLabel
    state
    step
    steps
    progress
    loss
    peakMiB
    message
    cancelRequested
    createdAt
    createdBy
  }
`);

/** Who may use the adapter: the owner as a person reads it, or "public" (every caller of the model). */
export function ownerText(job: Pick<TrainJob_Row, 'owner' | 'ownerLabel'>): string {
  return job.ownerLabel ?? job.owner ?? 'public';
}

/** Loss to the precision a curve is read at: 2.3456 → "2.346", 0.000123 → "0.000123". */
export function formatLoss(loss: number): string {
  return Math.abs(loss) >= 0.01 || loss === 0 ? loss.toFixed(3) : loss.toPrecision(3);
}

/** "loss 1.234 · peak 3.2 GiB", or null before the trainer has said either. */
export function lossAndPeak(job: Pick<TrainJob_Row, 'loss' | 'peakMiB'>): string | null {
  const parts = [
    job.loss != null ? `loss ${formatLoss(job.loss)}` : null,
    job.peakMiB != null ? `peak ${formatMiB(job.peakMiB)}` : null,
  ].filter(Boolean);
  return parts.length ? parts.join(' · ') : null;
}

/**
 * How far a job has come. A bar only once the trainer has said how many steps there are (it never invents a
 * percentage): before that, the step count alone. A queued job shows why it waits instead.
 */
export function TrainProgress({ job }: { job: TrainJob_Row }) {
  const figures = lossAndPeak(job);
  if (job.state === 'QUEUED') return <span className="muted">not started</span>;
  if (job.steps === 0) {
    return (
      <span className="size">
        {job.state === 'RUNNING' ? (
          <span className="muted">starting: the trainer has not said how many steps yet</span>
        ) : (
          <span className="muted">ended before its first step</span>
        )}
        {figures ? <span className="muted"> · {figures}</span> : null}
      </span>
    );
  }
  const percent = Math.round(job.progress * 1000) / 10;
  const steps = `step ${job.step.toLocaleString('en')} of ${job.steps.toLocaleString('en')}`;
  return (
    <div className="progress">
      <div
        className={`bar${job.state === 'FAILED' ? ' failed' : job.state === 'CANCELLED' ? ' stopped' : ''}`}
        role="progressbar"
        aria-label={`${job.name} progress`}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={percent}
        aria-valuetext={`${steps}, ${percent.toFixed(1)} %`}
      >
        <div className="bar-fill" style={{ width: `${percent}%` }} />
      </div>
      <span className="progress-text" data-testid="train-steps">
        {steps} <span className="muted">({percent.toFixed(1)} %)</span>
      </span>
      {figures ? <span className="progress-text muted">{figures}</span> : null}
    </div>
  );
}
