import type { AuditService } from '../audit/audit.service.js';
import { withState } from '../audit/message.js';
import type { Actor } from '../auth/actor.js';
import type { Db, Tx } from '../db/client.js';
import type { TrainJob } from '../generated/prisma/client.js';
import { ConflictError, fail, ok, type Result } from '../lib/errors.js';
import { notify } from '../pubsub.js';

// The one way a training job's change is written: its event (what the console's log shows) and the NOTIFYs its
// watchers and its node's agent wait on, in the transaction of the change. Ending a job, by its node, by the
// sweep or by removing its node (fleet), goes through here, so no path leaves a job failed with no word of why.
// Needs only the database and the audit log: the fleet is given it before the rest of training exists.

export class TrainLedger {
  private readonly db: Db;
  private readonly audit: AuditService;

  constructor(deps: { db: Db; audit: AuditService }) {
    this.db = deps.db;
    this.audit = deps.audit;
  }

  async event(tx: Db | Tx, jobId: string, level: 'info' | 'warn' | 'error', message: string) {
    await tx.trainEvent.create({ data: { jobId, level, message: message.slice(0, 4000) } });
  }

  /** Queues the NOTIFYs for a job's change: its watchers, and its node's agent. */
  async changed(tx: Db | Tx, job: Pick<TrainJob, 'id' | 'nodeId'>) {
    await notify(tx, 'trainJob', job.id);
    if (job.nodeId) await notify(tx, 'trainWork', job.nodeId);
  }

  /** Ends a running job, once: the conditional update makes a second end (a duplicate, an expiry) a no-op. */
  async end(
    id: string,
    state: 'DONE' | 'FAILED' | 'CANCELLED',
    message: string,
    where: { leaseOwner?: string | null; leaseUntilBefore?: Date },
    actor?: Actor,
    /** The loops' client when the sweep ends it. */
    db: Db = this.db,
  ): Promise<Result<TrainJob>> {
    const out = await db.$transaction(async (tx) => {
      const n = await tx.trainJob.updateMany({
        where: {
          id,
          state: 'RUNNING',
          ...(where.leaseOwner !== undefined ? { leaseOwner: where.leaseOwner } : {}),
          ...(where.leaseUntilBefore ? { leaseUntil: { lt: where.leaseUntilBefore } } : {}),
        },
        data: { state, message, finishedAt: new Date(), leaseOwner: null, leaseUntil: null },
      });
      if (n.count !== 1) return null;
      await this.event(tx, id, state === 'FAILED' ? 'error' : 'info', withState(state, message));
      const j = await tx.trainJob.findUniqueOrThrow({ where: { id } });
      if (actor)
        await this.audit.done(tx, actor, {
          action: 'finishTrainJob',
          target: j.name,
          message: `${state}: ${message}`,
          owner: j.owner,
        });
      await this.changed(tx, j);
      return j;
    });
    return out ? ok(out) : fail(new ConflictError('the job has already ended'));
  }

  /**
   * The jobs a node runs (leased to it or placed on it) and has queued, in the caller's transaction: fleet's
   * removeNode names them before it fails them (failNodeJobs) or refuses to.
   */
  async jobsOnNode(
    tx: Tx,
    nodeId: string,
  ): Promise<{ running: { id: string; name: string }[]; queued: { id: string; name: string }[] }> {
    const [running, queued] = [
      await tx.trainJob.findMany({
        where: { state: 'RUNNING', OR: [{ leaseOwner: nodeId }, { nodeId }] },
        select: { id: true, name: true },
      }),
      await tx.trainJob.findMany({ where: { state: 'QUEUED', nodeId }, select: { id: true, name: true } }),
    ];
    return { running, queued };
  }

  /**
   * Fails every job a node runs or has queued, in the caller's transaction (fleet's removeNode, before the node's
   * row goes): each says why in its message and its events, and its watchers and the node's agent are told.
   * Returns the jobs it failed; the caller audits the removal, which names them.
   */
  async failNodeJobs(tx: Tx, nodeId: string, reason: string): Promise<{ id: string; name: string }[]> {
    const jobs = await tx.trainJob.findMany({
      where: {
        OR: [
          { state: 'RUNNING', OR: [{ leaseOwner: nodeId }, { nodeId }] },
          { state: 'QUEUED', nodeId },
        ],
      },
      select: { id: true, name: true, state: true },
      orderBy: { createdAt: 'asc' },
    });
    const failed: { id: string; name: string }[] = [];
    for (const j of jobs) {
      // Conditional on the state read: a job its node finished a moment ago keeps its own end.
      const n = await tx.trainJob.updateMany({
        where: { id: j.id, state: j.state },
        data: { state: 'FAILED', message: reason, finishedAt: new Date(), leaseOwner: null, leaseUntil: null },
      });
      if (n.count !== 1) continue;
      await this.event(tx, j.id, 'error', withState('FAILED', reason));
      await this.changed(tx, await tx.trainJob.findUniqueOrThrow({ where: { id: j.id } }));
      failed.push({ id: j.id, name: j.name });
    }
    return failed;
  }
}
