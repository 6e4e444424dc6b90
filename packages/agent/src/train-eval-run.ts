import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import type { TrainControl } from './train-control.js';
import type { AdapterEvaluator, EvalQuestion } from './train-evaluate.js';
import type { TrainSpec } from './train-spec.js';
import type { Progress } from './trainer-progress.js';

// A job's held-out pairs on the node: kept out of what the trainer trains on (it gets them apart, as eval_path,
// to report the held-out loss), and answered by the base and the adapter once the adapter is uploaded.

type EvalPart = NonNullable<TrainSpec['eval']>;

/**
 * Writes the pairs the trainer trains on (the data less the held-out lines) and the held-out pairs, and says
 * where. Lines are counted as the control plane counts them (from 1, blank lines included).
 */
export async function splitHeldOut(dataPath: string, ev: EvalPart | undefined, dir: string) {
  if (!ev) return { trainPath: dataPath, evalPath: null as string | null };
  const held = new Set(ev.held_out_lines);
  const lines = (await fs.readFile(dataPath, 'utf8')).split('\n');
  const kept = lines.filter((_, i) => !held.has(i + 1));
  const trainPath = path.join(dir, 'train.ndjson');
  await fs.writeFile(trainPath, kept.join('\n'));
  let evalPath: string | null = null;
  if (ev.pairs.length) {
    evalPath = path.join(dir, 'eval.ndjson');
    await fs.writeFile(evalPath, `${ev.pairs.map((p) => JSON.stringify(p)).join('\n')}\n`);
  }
  return { trainPath, evalPath };
}

export type EvaluateAfterTrainingDeps = {
  control: Pick<TrainControl, 'download' | 'reportEvaluation'>;
  /** llama.cpp, for the GGUF adapter of a model llama.cpp serves. */
  evaluator: AdapterEvaluator;
  /** vLLM, for the PEFT adapter of a model vLLM serves (train-evaluate-vllm.ts). */
  vllmEvaluator?: AdapterEvaluator;
  log: Logger;
  /** Where catalog models fetched to evaluate are kept between jobs (a model is gigabytes). */
  cacheDir: string;
};

/**
 * After the upload: the base and the adapter answer the held-out and the general questions, and the answers go
 * to the control plane. An evaluation that cannot run leaves the job DONE with a warning: the adapter is trained
 * and kept, and the console shows that it was not compared. Only a cancel (the signal) ends it early.
 */
export async function evaluateAfterTraining(
  deps: EvaluateAfterTrainingDeps,
  job: {
    id: string;
    dir: string;
    signal: AbortSignal;
    /** The base weights the trainer read and the PEFT adapter it wrote: what vLLM evaluates. */
    baseDir?: string;
    outDir?: string;
    gpuIndex?: number;
  },
  spec: TrainSpec,
  progress: Progress,
) {
  const ev = spec.eval;
  if (!ev) return;
  if (ev.engine === 'vllm') return evaluateOnVllm(deps, job, ev, progress);
  if (!ev.model) {
    progress.event('warn', `the adapter was not evaluated against its base: ${ev.model_note ?? 'no model to run'}`);
    return;
  }
  if (!deps.control.reportEvaluation) return;
  try {
    progress.setMessage('evaluating the adapter against its base: fetching the model');
    await fs.mkdir(deps.cacheDir, { recursive: true });
    const modelPath = path.join(
      deps.cacheDir,
      `${createHash('sha256').update(ev.model.url).digest('hex').slice(0, 32)}.gguf`,
    );
    const have = await fs.stat(modelPath).catch(() => null);
    if (have?.size !== ev.model.size)
      await deps.control.download(ev.model.url, modelPath, { bytes: ev.model.size, signal: job.signal });
    const adapterPath = path.join(job.dir, 'adapter.gguf');
    await deps.control.download(
      new URL(`/api/train/jobs/${encodeURIComponent(job.id)}/artifacts/gguf`, spec.data.url).toString(),
      adapterPath,
      {
        signal: job.signal,
      },
    );
    const questions = questionsOf(ev);
    progress.setMessage(
      `evaluating the adapter against its base: ${questions.length} questions, each answered by both`,
    );
    const answers = await deps.evaluator.answer({
      modelPath,
      adapterPath,
      questions,
      maxTokens: ev.max_tokens,
      seed: ev.seed,
      signal: job.signal,
      gpuIndex: job.gpuIndex,
      onProgress: (done, total) =>
        progress.setMessage(`evaluating the adapter against its base: ${done} of ${total} answers`),
    });
    await deps.control.reportEvaluation(job.id, answers);
  } catch (err) {
    notEvaluated(deps, job, progress, err);
  }
}

const questionsOf = (ev: EvalPart): EvalQuestion[] => [
  ...ev.pairs.map((p) => ({ set: 'pairs' as const, ...p })),
  ...ev.general.map((p) => ({ set: 'general' as const, ...p })),
];

/** An evaluation that could not run: the job stays DONE, its events say why. Only a cancel ends it otherwise. */
function notEvaluated(
  deps: EvaluateAfterTrainingDeps,
  job: { id: string; signal: AbortSignal },
  progress: Progress,
  err: unknown,
) {
  job.signal.throwIfAborted();
  const message = (err as Error).message;
  deps.log.warn('the adapter could not be evaluated', { jobId: job.id, error: message });
  progress.event('warn', `the adapter was not evaluated against its base: ${message}`);
}

/**
 * A vLLM model's job: its PEFT adapter, as the trainer wrote it, on the base weights the trainer read (both are on
 * this node already), served by vLLM as the model's replicas will serve the published adapter.
 */
async function evaluateOnVllm(
  deps: EvaluateAfterTrainingDeps,
  job: { id: string; signal: AbortSignal; baseDir?: string; outDir?: string; gpuIndex?: number },
  ev: EvalPart,
  progress: Progress,
) {
  if (!deps.control.reportEvaluation) return;
  try {
    if (!deps.vllmEvaluator || !job.baseDir || !job.outDir)
      throw new Error('this agent cannot run vLLM to evaluate a PEFT adapter');
    const questions = questionsOf(ev);
    progress.setMessage(
      `evaluating the adapter against its base on vLLM: ${questions.length} questions, each answered by both`,
    );
    const answers = await deps.vllmEvaluator.answer({
      modelPath: job.baseDir,
      adapterPath: job.outDir,
      questions,
      maxTokens: ev.max_tokens,
      seed: ev.seed,
      signal: job.signal,
      gpuIndex: job.gpuIndex,
      onProgress: (done, total) =>
        progress.setMessage(`evaluating the adapter against its base on vLLM: ${done} of ${total} answers`),
    });
    await deps.control.reportEvaluation(job.id, answers);
  } catch (err) {
    notEvaluated(deps, job, progress, err);
  }
}
