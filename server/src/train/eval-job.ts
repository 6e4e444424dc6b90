import { z } from 'zod';
import { modelByName } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { TrainJob } from '../generated/prisma/client.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { checkTrainData } from './data.js';
import { DEFAULT_EVAL_SHARE, heldOutLines, MAX_HELD_OUT, MIN_HELD_OUT, pairsAtLines } from './eval-split.js';
import { catalogGguf } from './model-file.js';
import type { TrainReads } from './train-reads.js';

// A job's evaluation set, from submission to the node: which pairs are held out (createTrainJob), and what the
// node gets to judge the adapter with (the claim's spec). The scores are in eval-score.ts, the stored result in
// eval-store.ts.

/** createTrainJob's evaluation fields (added to its input). */
export const evalInputFields = {
  evalShare: z
    .number()
    .min(0, 'the share of pairs held out to evaluate the adapter: 0 (none) to 0.5')
    .max(0.5, 'at most 0.5: the adapter must still be trained on most of the pairs')
    .nullish(),
  evalSeed: z
    .number()
    .int('a whole number')
    .min(0, 'the seed that picks the held-out pairs: 0 to 2147483647')
    .max(2_147_483_647, 'at most 2147483647')
    .nullish(),
  evalData: z.string().nullish(),
};

export type EvalChoice = { evalShare: number; evalSeed: number; heldOutLines: number[]; evalDataSha256: string | null };

/**
 * The pairs held out of training: `evalShare` of them (default 10 %, at least MIN_HELD_OUT, at most MAX_HELD_OUT)
 * picked by `evalSeed` (default the training seed), or none when an explicit evaluation file (`evalData`) is given.
 */
export async function chooseHeldOut(
  reads: Pick<TrainReads, 'keepData'>,
  input: { evalShare?: number | null; evalSeed?: number | null; evalData?: string | null },
  data: string,
  trainingSeed: number,
): Promise<Result<EvalChoice>> {
  const seed = input.evalSeed ?? trainingSeed;
  if (input.evalData) {
    if (input.evalShare)
      return fail(
        new ValidationError(
          'evalShare',
          'give either an evaluation file (evalData) or a share of the pairs to hold out (evalShare), not both',
        ),
      );
    const report = checkTrainData(input.evalData);
    const bad = report.errors[0];
    if (bad) return fail(new ValidationError('evalData', `line ${bad.line}: ${bad.message}`));
    if (report.pairs === 0)
      return fail(
        new ValidationError('evalData', 'the evaluation file holds no pairs: NDJSON of {"q": "…", "a": "…"}'),
      );
    if (report.pairs > MAX_HELD_OUT)
      return fail(
        new ValidationError(
          'evalData',
          `the evaluation file has ${report.pairs} pairs; at most ${MAX_HELD_OUT} (each is answered twice on the node after training)`,
        ),
      );
    await reads.keepData(input.evalData, report.sha256);
    return ok({ evalShare: 0, evalSeed: seed, heldOutLines: [], evalDataSha256: report.sha256 });
  }
  const share = input.evalShare ?? DEFAULT_EVAL_SHARE;
  return ok({ evalShare: share, evalSeed: seed, heldOutLines: heldOutLines(data, share, seed), evalDataSha256: null });
}

/** What the node needs to evaluate the adapter after training (docs/training.md, "Evaluation"). */
export type EvalSpec = {
  seed: number;
  /** The data's lines the trainer must not train on (it gets them apart, as eval_path, for the held-out loss). */
  held_out_lines: number[];
  /** The held-out pairs (or the evaluation file's). */
  pairs: { q: string; a: string }[];
  /** Questions unrelated to the pairs, to catch forgetting. */
  general: { q: string; a: string }[];
  /** The catalog model's GGUF, which the base and the adapter answer with; null when there is none to run. */
  model: { url: string; size: number } | null;
  /** Why there is no model to run, when there is none. */
  model_note: string | null;
  /** The longest answer generated, in tokens. */
  max_tokens: number;
  min_questions: number;
  /**
   * Which engine answers: llama.cpp with the GGUF adapter on `model`, or vLLM (the model's engine) with the PEFT
   * adapter on the base weights the node trained from. Agents before it read only `model` and `model_note`.
   */
  engine: 'llamacpp' | 'vllm';
};

export async function evalSpec(
  deps: {
    db: Db;
    mirror: MirrorService;
    reads: Pick<TrainReads, 'readData' | 'jobData'>;
    /** Hangar's general questions, or the site's (site-questions.ts). */
    general: { q: string; a: string }[];
  },
  job: TrainJob,
): Promise<EvalSpec> {
  // From the data dir or the mirror's bucket (train-files.ts), wherever this replica finds them.
  const evalText = job.evalDataSha256 ? await deps.reads.readData(job.evalDataSha256) : null;
  if (job.evalDataSha256 && evalText === null)
    throw new Error(`the job's evaluation file (sha256 ${job.evalDataSha256}) is not kept any more`);
  const pairs =
    evalText !== null
      ? pairsAtLines(evalText, 'all')
      : job.heldOutLines.length
        ? pairsAtLines(await deps.reads.jobData(job), job.heldOutLines)
        : [];
  let model: EvalSpec['model'] = null;
  let note: string | null = null;
  // A vLLM model's adapter is evaluated as it will be served: the PEFT adapter on vLLM.
  const vllm = (await modelByName(deps.db, job.model))?.engine === 'vllm';
  if (vllm) note = 'the model is served by vLLM, and this agent evaluates with llama.cpp only: update the agent';
  else if (!job.gguf) note = 'the job makes no llama.cpp adapter; the node evaluates with llama.cpp only';
  else {
    const local = await catalogGguf(deps.db, deps.mirror, job.model);
    // Its size from the row on a bucket: the agent fetches the file itself, from /mirror.
    if (local.ok) model = { url: local.source, size: await local.size() };
    else note = local.reason;
  }
  return {
    seed: job.evalSeed,
    held_out_lines: job.heldOutLines,
    pairs,
    general: deps.general,
    model,
    model_note: note,
    max_tokens: 48,
    min_questions: MIN_HELD_OUT,
    engine: vllm ? 'vllm' : 'llamacpp',
  };
}
