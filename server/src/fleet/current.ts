import type { Replica } from '../generated/prisma/client.js';
import { type PlacementModel, wanted } from './placement.js';

// Which replica rows the console shows. Rows outlive what they describe (a stopped or lost replica is kept a while
// so placement can tell a node shutting down, and deleted later), and shown all together they told three stories
// at once: STOPPED chips from an hour of mode changes next to the READY one. What happened is in the audit log
// (reportReplica, smokeTest, leaveNode); a card shows what is true now.

const RUNNING = new Set(['PENDING', 'LOADING', 'READY']);
/** A failure on a node stays shown on it as long as placement keeps the model off that node for it. */
const NODE_FAILURE_MS = 5 * 60_000;

type Row = Pick<Replica, 'state' | 'desired' | 'createdAt' | 'updatedAt'>;

/**
 * A model's replicas as they stand: those placed, loading or serving (one asked to stop still serves until its
 * agent stops it), and a failed or lost one only while the model has fewer serving than it wants, since then it
 * is the reason. Never a stopped one.
 */
export function currentReplicas<R extends Row>(
  model: Pick<PlacementModel, 'minReplicas' | 'maxReplicas' | 'awakeUntil'>,
  replicas: R[],
  now = new Date(),
): R[] {
  const running = replicas.filter((r) => RUNNING.has(r.state));
  const serving = running.filter((r) => r.state === 'READY' && r.desired === 'RUN').length;
  const short = Math.max(0, wanted(model, now) - serving);
  const ended = replicas
    .filter((r) => r.state === 'FAILED' || r.state === 'LOST')
    .sort((a, b) => b.updatedAt.getTime() - a.updatedAt.getTime())
    .slice(0, short);
  return [...running, ...ended].sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
}

/** A node's replicas as they stand: those placed on it, loading or serving, and one that failed there lately. */
export function currentOnNode<R extends Row>(replicas: R[], now = new Date()): R[] {
  return replicas.filter(
    (r) => RUNNING.has(r.state) || (r.state === 'FAILED' && now.getTime() - r.updatedAt.getTime() < NODE_FAILURE_MS),
  );
}
