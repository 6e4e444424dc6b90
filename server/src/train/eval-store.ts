import fs from 'node:fs/promises';
import { z } from 'zod';
import type { Actor } from '../auth/actor.js';
import type { Config } from '../config.js';
import type { Db, Tx } from '../db/client.js';
import type { TrainEvaluation, TrainJob } from '../generated/prisma/client.js';
import { ConflictError, fail, NotFoundError, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { describeMetric, type EvalMetric, type EvalVerdict, evaluate } from './eval-score.js';
import type { TrainLedger } from './train-ledger.js';
import type { TrainReads } from './train-reads.js';

// A job's evaluation as the node reported it and Hangar scored it, and the gate it puts on publishing: an adapter
// clearly worse than its base on its own held-out pairs, or on the general questions (forgetting), is not
// published unless someone forces it and says why. A site can ask for more (hangar.yaml: training.publishRequires).

const answer = z.object({
  set: z.enum(['pairs', 'general']),
  question: z.string().max(20_000),
  reference: z.string().max(20_000),
  baseAnswer: z.string().max(20_000),
  adapterAnswer: z.string().max(20_000),
  baseLogLikelihood: z.number().refine(Number.isFinite, 'a finite number'),
  adapterLogLikelihood: z.number().refine(Number.isFinite, 'a finite number'),
});
const reportInput = z.object({ answers: z.array(answer).max(1000, 'at most 1000 answers') });

/** What a site asks of an adapter before it is published (hangar.yaml `training.publishRequires`). */
export type PublishRequirement = 'NOT_WORSE' | 'BETTER';
const siteFile = z.object({
  training: z
    .object({
      publishRequires: z.enum(['NOT_WORSE', 'BETTER'], { error: 'NOT_WORSE (the default) or BETTER' }).optional(),
    })
    .optional(),
});

export type StoredEvaluation = TrainEvaluation & { metricRows: EvalMetric[] };

export type TrainEvaluationsDeps = {
  db: Db;
  config: Pick<Config, 'configFile'>;
  reads: Pick<TrainReads, 'get'>;
  ledger: Pick<TrainLedger, 'event'>;
};

export class TrainEvaluations {
  constructor(private readonly deps: TrainEvaluationsDeps) {}

  get(jobId: string) {
    return this.deps.db.trainEvaluation.findUnique({ where: { jobId } });
  }

  /** The node's answers for its running job: scored, stored (replacing an earlier report), and announced. */
  async record(actor: Actor, id: string, raw: unknown): Promise<Result<TrainEvaluation>> {
    const parsed = parseInput(reportInput, raw, 'input');
    if (!parsed.ok) return parsed;
    if (actor.viewer.kind !== 'node') return fail(new ConflictError('only the node running a job reports on it'));
    const job = await this.deps.reads.get(id);
    if (!job) return fail(new NotFoundError(`no training job ${id}`));
    if (job.state !== 'RUNNING' || job.leaseOwner !== actor.viewer.node.id)
      return fail(
        new ConflictError(`the job is not running on node ${actor.viewer.node.name}: its evaluation is not taken`),
      );
    const answers = parsed.value.answers;
    const e = evaluate(answers, job.evalSeed);
    const heldOut = answers.filter((a) => a.set === 'pairs').length;
    const data = {
      heldOut,
      seed: job.evalSeed,
      verdict: e.verdict,
      forgettingVerdict: e.forgettingVerdict,
      metrics: e.metrics,
      questions: e.questions,
    };
    const row = await this.deps.db.$transaction(async (tx) => {
      const r = await tx.trainEvaluation.upsert({ where: { jobId: id }, create: { jobId: id, ...data }, update: data });
      const f1 = (set: string) => e.metrics.find((m) => m.set === set && m.name === 'tokenF1');
      const pairs = f1('pairs');
      await this.deps.ledger.event(
        tx,
        id,
        e.verdict === 'WORSE' || e.forgettingVerdict === 'WORSE' ? 'warn' : 'info',
        `evaluated on ${heldOut} held-out pairs: ${e.verdict}${pairs && heldOut ? ` (${describeMetric(pairs)})` : ''}; on the general questions: ${e.forgettingVerdict}`,
      );
      await notify(tx, 'trainJob', id);
      return r;
    });
    return ok(row);
  }

  /** Marks the evaluation as a published adapter's, so it outlives the job (train.service.ts remove). */
  async published(tx: Tx, jobId: string) {
    await tx.trainEvaluation.updateMany({ where: { jobId }, data: { published: true } });
  }

  /** Removes an unpublished job's evaluation with the job. */
  async forget(tx: Tx, jobId: string) {
    await tx.trainEvaluation.deleteMany({ where: { jobId, published: false } });
  }

  /**
   * Whether the adapter may be published: a refusal that says which comparison failed and by how much, or the
   * line the audit keeps (the evaluation, and the reason when forced past it).
   */
  async gate(job: TrainJob, o: { force?: boolean | null; reason?: string | null }): Promise<Result<{ audit: string }>> {
    const reason = o.reason?.trim() ?? '';
    if (o.force && !reason)
      return fail(
        new ValidationError('reason', 'publishing past the evaluation needs a reason, kept in the audit log'),
      );
    const required = await this.requirement();
    if (!required.ok) return required;
    const requires = required.value;
    const ev = await this.get(job.id);
    const problems: string[] = [];
    if (!ev) {
      if (requires === 'BETTER')
        problems.push('the job has no evaluation, and this site publishes only adapters evaluated BETTER');
    } else {
      const metrics = ev.metrics as EvalMetric[];
      const worst = (set: string) => {
        const decisive = metrics.filter((m) => m.set === set && (m.name === 'tokenF1' || m.name === 'logLikelihood'));
        const below = decisive.filter((m) => m.high < 0);
        return (below.length ? below : decisive).map(describeMetric).join('; ');
      };
      if (ev.verdict === 'WORSE')
        problems.push(`on its ${ev.heldOut} held-out pairs the adapter is WORSE than its base: ${worst('pairs')}`);
      if (ev.forgettingVerdict === 'WORSE')
        problems.push(
          `on the general questions the adapter is WORSE than its base (it has forgotten): ${worst('general')}`,
        );
      if (requires === 'BETTER' && ev.verdict !== 'BETTER' && ev.verdict !== 'WORSE')
        problems.push(
          `on its held-out pairs the verdict is ${ev.verdict}, and this site publishes only adapters evaluated BETTER (hangar.yaml training.publishRequires)`,
        );
    }
    const summary = ev
      ? `evaluation: pairs ${ev.verdict}, general ${ev.forgettingVerdict} (${ev.heldOut} held out, seed ${ev.seed})`
      : 'no evaluation';
    if (!problems.length) return ok({ audit: summary });
    if (o.force)
      return ok({ audit: `${summary}; published with force past: ${problems.join(' | ')}; reason: ${reason}` });
    return fail(
      new ConflictError(
        `not published: ${problems.join('; and ')}. Train again (more or better pairs, fewer epochs), or publish with force: true and a reason`,
      ),
    );
  }

  /** hangar.yaml's `training.publishRequires`, read at each publish (a small file); NOT_WORSE without one. */
  private async requirement(): Promise<Result<PublishRequirement>> {
    const file = this.deps.config.configFile;
    if (!file) return ok('NOT_WORSE');
    const { parse } = await import('yaml');
    const parsed = siteFile.safeParse(parse(await fs.readFile(file, 'utf8')) ?? {});
    // Refused rather than read as the default: a typo there must not quietly let a worse adapter through.
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      return fail(
        new ConflictError(
          `not published: HANGAR_CONFIG=${file}: ${issue?.path.join('.')}: ${issue?.message}. Fix the file`,
        ),
      );
    }
    return ok(parsed.data.training?.publishRequires ?? 'NOT_WORSE');
  }
}

export type { EvalVerdict };
