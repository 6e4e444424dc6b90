import type { JobState } from '../../graphql/types';

const stateClass: Record<JobState, string> = {
  QUEUED: 'muted',
  RUNNING: 'arriving',
  DONE: 'ok',
  FAILED: 'bad',
  CANCELLED: 'muted',
};

/** A serve job's or a training job's state, in words: "queued", "running", "done". */
export function jobBadge(state: JobState) {
  return <span className={`badge ${stateClass[state] ?? ''}`}>{state.toLowerCase()}</span>;
}
