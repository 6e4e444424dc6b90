import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { packDirectory } from '@hangar/common/peft/peft-tar';
import { backoffMs, sleep } from '@hangar/common/retry';
import { ControlPlaneError } from './control-plane.js';
import {
  type DownloadOptions,
  type TrainAssignment,
  type TrainControl,
  type TrainSpec,
  TrainSpecError,
} from './train-control.js';
import { evaluateAfterTraining, splitHeldOut } from './train-eval-run.js';
import type { AdapterEvaluator } from './train-evaluate.js';
import { fetchBase, safeName } from './trainer-base.js';
import { messageOf, runTrainer, trainerFailure } from './trainer-process.js';
import { Progress } from './trainer-progress.js';

// Runs this node's LoRA training jobs (docs/training.md), one at a time: claims a queued job from the work list,
// fetches its pairs and base weights, runs the trainer, streams its progress, uploads the adapter and finishes
// the job. The control plane may restart at any point: reports are kept and sent again, and the trainer keeps
// running. What ends a job early is an operator's cancel, a refusal from the control plane (the job ended there),
// or the agent stopping.
// Its parts live beside it: the base weights' cache (trainer-base.ts), the trainer child and its protocol
// (trainer-process.ts), the progress reports (trainer-progress.ts). Over 400 lines because what is left is one
// state machine: claims, a job's intent (cancel, drop, stop) and the stop deadline are read by every step of a
// job, and cutting the steps out would hand that state around instead of keeping it in one place.

export type TrainWorkerOptions = {
  control: TrainControl;
  /** <agent dir>/train: jobs/<id>/ while a job runs (removed after), base/<repo@revision>/ kept as a cache. */
  workDir: string;
  /** The trainer's command line; `--job <job.json> --out <dir>` is appended. */
  trainer: string[];
  log: Logger;
  /** How long the trainer gets after SIGTERM before SIGKILL. */
  graceMs?: number;
  /** At most one progress report this often (the control plane's contract: 500 ms). */
  reportMs?: number;
  /** An empty report this often while nothing else is said, to keep the job's lease. */
  keepaliveMs?: number;
  /** The first wait before a claim, finish or upload that did not get through is tried again; it doubles to 30 s. */
  retryMs?: number;
  /** On stop(), how long reports and the FAILED get to reach the control plane after the trainer has exited. */
  stopReportMs?: number;
  /** Passed to each download (tests shorten the waits). */
  download?: Pick<DownloadOptions, 'attempts' | 'backoffMs' | 'stallMs'>;
  /**
   * This node's GPUs as they are now. A job is claimed only when one has the memory it needs, and its trainer
   * sees that one GPU alone (CUDA_VISIBLE_DEVICES): on a node with several, two jobs or a job and a replica would
   * otherwise all land on GPU 0.
   */
  gpus?: () => Promise<Gpu[]>;
  /** Answers the held-out questions with the base and the adapter after the upload (train-evaluate.ts). */
  evaluator?: AdapterEvaluator;
  /** The same on vLLM, for a model vLLM serves (train-evaluate-vllm.ts). */
  vllmEvaluator?: AdapterEvaluator;
};

export type Gpu = { index: number; name: string; totalMiB: number; freeMiB: number };

/** How long to wait before asking the GPUs again when none has room for the next job. */
const NO_ROOM_RETRY_MS = 5000;

type Phase = 'claiming' | 'fetching' | 'training' | 'uploading' | 'evaluating' | 'finishing';

type Job = {
  id: string;
  name: string;
  phase: Phase;
  abort: AbortController;
  /** Why the job is ending early: an operator's cancel, a refusal (finish nothing), or the agent stopping. */
  intent?: 'cancel' | 'drop' | 'stop';
  why?: string;
  /** Where the job was when it was told to end. */
  intentPhase?: Phase;
  /** How the trainer was made to stop, for the final message. */
  stopped?: string;
  /** The GPU it trains on, when the node has any. */
  gpu?: Gpu;
  gpuMiB: number;
  progress?: Progress;
};

type Outcome = { state: 'DONE' | 'FAILED' | 'CANCELLED'; message?: string } | { state: 'NONE'; why: string };

/** The files a PEFT adapter is made of; the control plane checks them again on upload. */
export const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors'] as const;

export class TrainWorker {
  private current: Job | undefined;
  private running: Promise<void> | undefined;
  private latest: TrainAssignment[] = [];
  /** Jobs this worker has ended: a list sent before the end landed may still show them RUNNING. */
  private readonly ended = new Set<string>();
  /** Claimed by another runner holding this node's token (a second agent): its to run and to finish. */
  private readonly elsewhere = new Set<string>();
  /** Claims refused for another reason (the job was deleted): not asked again. */
  private readonly refused = new Set<string>();
  /** Claims whose answer never came back: if the job then shows up RUNNING, that is why it has no trainer. */
  private readonly lostClaims = new Set<string>();
  private readonly finishing = new Set<Promise<void>>();
  private unsubscribe: (() => void) | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  private claimFailures = 0;
  private claimRetryAt = 0;
  private stopped = false;
  private stopDeadline = Number.POSITIVE_INFINITY;
  private readonly stopping = new AbortController();
  /** The retries waiting out a backoff, each cut short by controlPlaneBack(). */
  private readonly wakers = new Set<() => void>();
  private readonly graceMs: number;

  constructor(private readonly o: TrainWorkerOptions) {
    if (!o.trainer.length) throw new Error('the trainer command is empty');
    this.graceMs = o.graceMs ?? 10_000;
  }

  /** Subscribes to the node's work; jobs run as they come. */
  start() {
    this.unsubscribe = this.o.control.work(
      (jobs) => this.onWork(jobs),
      () => this.controlPlaneBack(),
    );
  }

  /**
   * The control plane answers again (the work connection is back, or a heartbeat got through): what was kept
   * while it was away (progress, the adapter, the job's end) is sent now rather than at the end of a backoff.
   * A control plane back from an outage gives a node the lost time to report (docs/training.md); a retry
   * waiting out its 30 s backoff could miss that.
   */
  controlPlaneBack() {
    if (this.stopped) return;
    for (const wake of [...this.wakers]) wake();
    this.current?.progress?.retryNow();
    if (this.claimRetryAt > Date.now() && this.claimFailures) {
      this.claimRetryAt = 0;
      this.pick();
    }
  }

  /** The job being worked on, for tests and logs. */
  snapshot() {
    const j = this.current;
    return j ? { id: j.id, phase: j.phase, intent: j.intent ?? null } : null;
  }

  /**
   * Stops the trainer (SIGTERM, SIGKILL after the grace time) and reports the job FAILED "the agent was stopped":
   * failing it now is honest and immediate, where leaving it to the lease would show a dead job as running for
   * two minutes. Takes at most the grace time plus stopReportMs.
   */
  async stop() {
    if (this.stopped) return;
    this.stopped = true;
    this.stopDeadline = Date.now() + this.graceMs + (this.o.stopReportMs ?? 5000);
    this.stopping.abort();
    this.unsubscribe?.();
    clearTimeout(this.retryTimer);
    const job = this.current;
    if (job) this.setIntent(job, 'stop');
    await this.running;
    await Promise.allSettled([...this.finishing]);
  }

  private onWork(jobs: TrainAssignment[]) {
    if (this.stopped) return;
    this.latest = jobs;
    // A job gone from the list has ended for good (states only move forward): forget it, so these stay small.
    const listed = new Set(jobs.map((j) => j.id));
    for (const set of [this.ended, this.elsewhere, this.refused, this.lostClaims])
      for (const id of set) if (!listed.has(id)) set.delete(id);
    for (const j of jobs) {
      if (j.state !== 'RUNNING') continue;
      const job = this.current;
      if (job?.id === j.id) {
        if (j.cancelRequested) this.setIntent(job, 'cancel');
        continue;
      }
      if (this.ended.has(j.id) || this.elsewhere.has(j.id)) continue;
      this.ended.add(j.id);
      this.endOrphan(j);
    }
    this.pick();
  }

  /** A RUNNING job leased to this node that no trainer here runs: the agent restarted, or lost the claim's answer. */
  private endOrphan(j: TrainAssignment) {
    const [state, message]: ['FAILED' | 'CANCELLED', string] = j.cancelRequested
      ? ['CANCELLED', 'cancelled; no trainer was running it on this node (the agent had restarted)']
      : this.lostClaims.has(j.id)
        ? [
            'FAILED',
            "this node's claim went through but its answer was lost on the way, so the trainer never started; run it again",
          ]
        : ['FAILED', 'the agent restarted (or lost the trainer) while the job was running; run it again'];
    this.o.log.warn('a running job has no trainer on this node; ending it', { jobId: j.id, name: j.name, state });
    const p = this.finishReliably(j.id, state, message).finally(() => this.finishing.delete(p));
    this.finishing.add(p);
  }

  /** When idle, claims the first queued job of the latest list. */
  private pick() {
    if (this.stopped || this.current) return;
    clearTimeout(this.retryTimer);
    const next = this.latest.find(
      (j) => j.state === 'QUEUED' && !this.ended.has(j.id) && !this.elsewhere.has(j.id) && !this.refused.has(j.id),
    );
    if (!next) return;
    const wait = this.claimRetryAt - Date.now();
    if (wait > 0) {
      this.retryTimer = setTimeout(() => this.pick(), wait);
      return;
    }
    const job: Job = {
      id: next.id,
      name: next.name,
      phase: 'claiming',
      abort: new AbortController(),
      gpuMiB: next.gpuMiB,
    };
    this.current = job;
    this.running = this.run(job)
      .catch((err: unknown) =>
        this.o.log.error('the training worker failed unexpectedly', { jobId: job.id, error: err }),
      )
      .finally(() => {
        this.current = undefined;
        this.running = undefined;
        this.pick();
      });
  }

  private async run(job: Job) {
    const { control, log } = this.o;
    const gpus = this.o.gpus ? await this.o.gpus().catch(() => []) : [];
    if (gpus.length) {
      // The one with the most room, among those with enough: the job may grow past its estimate.
      const fits = gpus.filter((g) => g.freeMiB >= job.gpuMiB).sort((a, b) => b.freeMiB - a.freeMiB);
      if (!fits[0]) {
        const most = Math.max(...gpus.map((g) => g.freeMiB));
        log.info('no GPU has room for the next job yet; not claiming it', { jobId: job.id, needs: job.gpuMiB, most });
        this.claimRetryAt = Date.now() + NO_ROOM_RETRY_MS;
        return;
      }
      job.gpu = fits[0];
    }
    let spec: TrainSpec;
    try {
      spec = (await control.claim(job.id)).spec;
      this.claimFailures = 0;
      this.lostClaims.delete(job.id);
    } catch (err) {
      if (err instanceof TrainSpecError) {
        // The claim went through, so the job is this node's: end it with the reason rather than leave it leased.
        this.ended.add(job.id);
        log.error('claimed a job whose spec this agent cannot read', { jobId: job.id, error: err.message });
        await this.finishReliably(job.id, 'FAILED', err.message);
        return;
      }
      if (err instanceof ControlPlaneError && err.kind === 'refused') {
        this.claimFailures = 0;
        if (err.errorType === 'ConflictError') {
          // Another runner has it (or the control plane failed it while claiming): not this node's to touch.
          this.elsewhere.add(job.id);
          log.info('the job was not claimed here', { jobId: job.id, reason: err.message });
        } else {
          this.refused.add(job.id);
          log.warn('the control plane refused the claim', { jobId: job.id, error: err.message });
        }
        return;
      }
      this.claimFailures++;
      this.lostClaims.add(job.id);
      this.claimRetryAt = Date.now() + this.backoff(this.claimFailures);
      log.warn('the claim did not get through; asking again', { jobId: job.id, error: (err as Error).message });
      return;
    }

    log.info('claimed a training job', { jobId: job.id, name: job.name, base: spec.base_repo });
    const dir = path.join(this.o.workDir, 'jobs', safeName(job.id));
    const progress = new Progress({
      send: (input) => control.report(job.id, input),
      onRefused: (err) => this.setIntent(job, 'drop', err.message),
      intervalMs: this.o.reportMs ?? 500,
      keepaliveMs: this.o.keepaliveMs ?? 10_000,
      log,
      jobId: job.id,
    });
    job.progress = progress;
    let outcome: Outcome;
    try {
      outcome = await this.train(job, spec, dir, progress);
    } catch (err) {
      outcome = { state: 'FAILED', message: messageOf(err) };
    }
    const intent = job.intent;
    job.phase = 'finishing';
    if (intent === 'cancel') outcome = { state: 'CANCELLED', message: `cancelled: ${howItStopped(job)}` };
    if (intent === 'stop')
      outcome = { state: 'FAILED', message: `the agent was stopped: ${howItStopped(job)}; run it again` };
    if (intent === 'drop') outcome = { state: 'NONE', why: `the control plane refused a report: ${job.why}` };

    if (outcome.state !== 'NONE') {
      // Every point and line before the end: once the job has ended, the control plane takes no more reports.
      await this.flushReports(progress);
      if (job.intent !== 'drop') await this.finishReliably(job.id, outcome.state, outcome.message);
      else outcome = { state: 'NONE', why: `the control plane refused a report: ${job.why}` };
    }
    progress.close();
    if (outcome.state === 'NONE')
      log.warn('the job ended on the control plane; stopped working on it here', {
        jobId: job.id,
        reason: outcome.why,
      });
    this.ended.add(job.id);
    await fs.rm(dir, { recursive: true, force: true }).catch((err: unknown) => {
      log.warn("the job's work directory could not be removed", { jobId: job.id, dir, error: err });
    });
  }

  private async train(job: Job, spec: TrainSpec, dir: string, progress: Progress): Promise<Outcome> {
    const signal = job.abort.signal;
    signal.throwIfAborted();
    await fs.rm(dir, { recursive: true, force: true });
    const out = path.join(dir, 'out');
    await fs.mkdir(out, { recursive: true });

    job.phase = 'fetching';
    progress.setMessage(`fetching the training data (${spec.data.pairs} pairs)`);
    const dataPath = path.join(dir, 'data.ndjson');
    try {
      await this.o.control.download(spec.data.url, dataPath, {
        ...this.o.download,
        sha256: spec.data.sha256,
        bytes: spec.data.bytes,
        signal,
      });
    } catch (err) {
      signal.throwIfAborted();
      throw new Error(`the training data could not be fetched: ${messageOf(err)}`);
    }
    const baseDir = await fetchBase(this.o, spec, progress, signal);
    signal.throwIfAborted();

    // The held-out pairs are never trained on: the trainer's data is the rest, and it gets them apart (eval_path)
    // only to report the loss on them. The spec's copy of them stays with the agent.
    const { eval: _held, ...forTrainer } = spec;
    const split = await splitHeldOut(dataPath, spec.eval, dir);
    const jobFile = path.join(dir, 'job.json');
    await fs.writeFile(
      jobFile,
      `${JSON.stringify({ ...forTrainer, data_path: split.trainPath, eval_path: split.evalPath, base_dir: baseDir, out_dir: out }, null, 2)}\n`,
    );
    job.phase = 'training';
    if (job.gpu)
      progress.event(
        'info',
        `training on GPU ${job.gpu.index} (${job.gpu.name}): ${job.gpu.freeMiB} MiB free of ${job.gpu.totalMiB}, the job asked for ${job.gpuMiB}`,
      );
    progress.setMessage('the trainer is starting (loading the base weights)');
    const run = await runTrainer(
      { trainer: this.o.trainer, graceMs: this.graceMs, log: this.o.log },
      job,
      jobFile,
      out,
      progress,
    );
    if (job.intent) return { state: 'FAILED', message: 'stopped' }; // run() words the end from the intent

    const failure = trainerFailure(run, this.o.trainer);
    if (failure) return { state: 'FAILED', message: failure };
    const missing = await missingFiles(out, ADAPTER_FILES);
    if (missing.length)
      return {
        state: 'FAILED',
        message: `the trainer said done, but its output directory lacks ${missing.join(' and ')}`,
      };

    job.phase = 'uploading';
    progress.setMessage('uploading the adapter');
    await this.flushReports(progress);
    const uploaded = await this.upload(job, out, progress);
    if (uploaded.state === 'DONE' && this.o.evaluator) {
      job.phase = 'evaluating';
      await evaluateAfterTraining(
        {
          control: this.o.control,
          evaluator: this.o.evaluator,
          vllmEvaluator: this.o.vllmEvaluator,
          log: this.o.log,
          cacheDir: path.join(this.o.workDir, 'eval-models'),
        },
        { id: job.id, dir, signal: job.abort.signal, baseDir, outDir: out, gpuIndex: job.gpu?.index },
        spec,
        progress,
      );
    }
    return uploaded;
  }

  private async upload(job: Job, out: string, progress: Progress): Promise<Outcome> {
    const signal = job.abort.signal;
    for (let failures = 0; ; ) {
      signal.throwIfAborted();
      try {
        const r = await this.o.control.upload(job.id, packDirectory(out), signal);
        if (!r.accepted)
          return { state: 'NONE', why: `the control plane refused the adapter and has failed the job: ${r.reason}` };
        progress.event(
          'info',
          `uploaded the adapter (${r.artifacts.map((a) => `${a.kind}: ${a.size} bytes`).join(', ')})`,
        );
        return { state: 'DONE' };
      } catch (err) {
        signal.throwIfAborted();
        if (!(err instanceof ControlPlaneError) || err.kind === 'refused')
          throw new Error(`the adapter could not be uploaded: ${messageOf(err)}`);
        // The control plane is away (a restart): the adapter is worth waiting for. A control plane that stays
        // away past the lease ends the job, and the next report, refused, stops this.
        failures++;
        if (failures === 1)
          this.o.log.warn('the adapter upload did not get through; trying again', {
            jobId: job.id,
            error: err.message,
          });
        await this.pause(this.backoff(failures), signal);
      }
    }
  }

  /** Sends finishTrainJob until it is taken or refused; after stop(), until the stop deadline. */
  private async finishReliably(id: string, state: 'DONE' | 'FAILED' | 'CANCELLED', message?: string) {
    const log = this.o.log;
    for (let failures = 0; ; ) {
      try {
        await this.o.control.finish(id, state, message);
        log.info(`finished a training job ${state}`, { jobId: id, message });
        return;
      } catch (err) {
        if (!(err instanceof ControlPlaneError) || err.kind === 'refused') {
          // Asking again gets the same answer (the job has already ended there): nothing more to do.
          log.warn('the control plane refused to finish the job', { jobId: id, state, error: (err as Error).message });
          return;
        }
        failures++;
        if (failures === 1)
          log.warn('finishing the job did not get through; trying again', { jobId: id, error: err.message });
        if (this.stopped && Date.now() >= this.stopDeadline) {
          log.warn('gave up finishing the job: the agent is stopping; its lease will end it', { jobId: id, state });
          return;
        }
        await this.pause(this.backoff(failures));
      }
    }
  }

  private async flushReports(progress: Progress) {
    if (!this.stopped) await Promise.race([progress.flush(), this.untilStopDeadline()]);
    else await Promise.race([progress.flush(), sleep(Math.max(0, this.stopDeadline - Date.now()))]);
  }

  /** Resolves at the stop deadline once stop() has been called; never before. */
  private untilStopDeadline() {
    return new Promise<void>((resolve) => {
      this.stopping.signal.addEventListener(
        'abort',
        () => void sleep(Math.max(0, this.stopDeadline - Date.now())).then(resolve),
        { once: true },
      );
    });
  }

  private setIntent(job: Job, intent: 'cancel' | 'drop' | 'stop', why?: string) {
    // A refusal wins over the rest (finishing would be refused too); otherwise the first reason stands, and a
    // job already finishing is left to finish.
    if (job.intent === 'drop' || (intent !== 'drop' && (job.intent || job.phase === 'finishing'))) return;
    job.intent = intent;
    job.intentPhase = job.phase;
    job.why = why;
    if (intent === 'cancel') this.o.log.info('cancel requested; stopping the job', { jobId: job.id, phase: job.phase });
    job.abort.abort(
      new Error(`the job was ${intent === 'cancel' ? 'cancelled' : intent === 'stop' ? 'stopped' : 'dropped'}`),
    );
  }

  private backoff(failures: number) {
    return backoffMs(failures - 1, { baseMs: this.o.retryMs ?? 2000, maxMs: 30_000 });
  }

  /** Waits `ms`; cut short to the stop deadline by stop(), and rejected by `signal`. */
  private pause(ms: number, signal?: AbortSignal) {
    return new Promise<void>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const cleanup = () => {
        clearTimeout(timer);
        this.wakers.delete(done);
        this.stopping.signal.removeEventListener('abort', onStop);
        signal?.removeEventListener('abort', onAbort);
      };
      const done = () => {
        cleanup();
        resolve();
      };
      this.wakers.add(done);
      const onStop = () => {
        clearTimeout(timer);
        timer = setTimeout(done, Math.max(0, Math.min(ms, this.stopDeadline - Date.now())));
      };
      const onAbort = () => {
        cleanup();
        reject(signal?.reason);
      };
      timer = setTimeout(done, ms);
      if (this.stopped) onStop();
      else this.stopping.signal.addEventListener('abort', onStop, { once: true });
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** What had happened to the trainer when a job was cancelled or the agent stopped, for the job's last message. */
function howItStopped(job: Job) {
  if (job.stopped) return job.stopped;
  switch (job.intentPhase) {
    case 'training':
      return 'the trainer had already exited';
    case 'uploading':
      return 'the trainer had finished; the adapter was not uploaded';
    case 'evaluating':
      return 'the adapter was uploaded; its evaluation against the base was stopped';
    default:
      return 'the trainer had not started';
  }
}

async function missingFiles(dir: string, names: readonly string[]) {
  const missing: string[] = [];
  for (const n of names) {
    const st = await fs.stat(path.join(dir, n)).catch(() => undefined);
    if (!st?.isFile() || st.size === 0) missing.push(n);
  }
  return missing;
}
