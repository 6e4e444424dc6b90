import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';
import type { Logger } from '@hangar/common/log';
import { sleep } from '@hangar/common/retry';
import type { TrainPoint } from './train-control.js';
import type { Gpu } from './trainer.js';
import type { Progress } from './trainer-progress.js';

// The trainer as a child process (docs/training.md, "the trainer's protocol"): started in a process group of its
// own on the job's GPU, its stdout read as protocol lines and its stderr kept as a tail, stopped with SIGTERM then
// SIGKILL after the grace time, and its whole group gone before the job is said to have stopped.

export type TrainerOptions = {
  /** The trainer's command line; `--job <job.json> --out <dir>` is appended. */
  trainer: string[];
  /** How long the trainer gets after SIGTERM before SIGKILL. */
  graceMs: number;
  log: Logger;
};

/** What of a job the trainer's run reads (and `stopped`, which it writes: how the trainer was made to stop). */
export type TrainerJob = {
  id: string;
  abort: AbortController;
  intent?: 'cancel' | 'drop' | 'stop';
  gpu?: Gpu;
  stopped?: string;
};

export type TrainerRun = {
  code: number | null;
  signal: NodeJS.Signals | null;
  done: boolean;
  error?: string;
  spawnError?: string;
  /** The last lines the trainer wrote to stderr, for a failure message. */
  tail: string[];
};

const TAIL_LINES = 20;
export const MESSAGE_MAX = 2000;

export function runTrainer(
  o: TrainerOptions,
  job: TrainerJob,
  jobFile: string,
  out: string,
  progress: Progress,
): Promise<TrainerRun> {
  const [command, ...args] = o.trainer;
  const run: TrainerRun = { code: null, signal: null, done: false, tail: [] };
  const log = o.log;
  return new Promise((resolve) => {
    let child: ChildProcess;
    try {
      // Its own process group, so a stop reaches the trainer's own children (data loader workers) too.
      child = spawn(command!, [...args, '--job', jobFile, '--out', out], {
        cwd: path.dirname(jobFile),
        env: job.gpu ? { ...process.env, CUDA_VISIBLE_DEVICES: String(job.gpu.index) } : process.env,
        detached: true,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
    } catch (err) {
      run.spawnError = messageOf(err);
      resolve(run);
      return;
    }
    const pid = child.pid;
    if (pid) log.info('the trainer started', { jobId: job.id, pid });
    let termAt: number | undefined;
    let killTimer: NodeJS.Timeout | undefined;
    let killed = false;
    const terminate = () => {
      if (termAt !== undefined || !pid || child.exitCode !== null || child.signalCode !== null) return;
      termAt = Date.now();
      log.info('stopping the trainer (SIGTERM)', { jobId: job.id, pid, why: job.intent });
      signalGroup(pid, 'SIGTERM');
      killTimer = setTimeout(() => {
        killed = true;
        log.warn('the trainer did not stop in its grace time; killing it', { jobId: job.id, pid });
        signalGroup(pid, 'SIGKILL');
      }, o.graceMs);
    };
    const signal = job.abort.signal;
    signal.addEventListener('abort', terminate, { once: true });
    if (signal.aborted) terminate();

    readline
      .createInterface({ input: child.stdout!, crlfDelay: Number.POSITIVE_INFINITY })
      .on('line', (line) => onStdout(line, run, progress));
    readline
      .createInterface({ input: child.stderr!, crlfDelay: Number.POSITIVE_INFINITY })
      .on('line', (line) => onStderr(line, run, progress));

    let closeTimer: NodeJS.Timeout | undefined;
    child.once('error', (err) => {
      run.spawnError = err.message;
    });
    child.once('exit', (code, sig) => {
      run.code = code;
      run.signal = sig;
      clearTimeout(killTimer);
      // Whatever of its group outlived the trainer (an orphaned worker) would hold GPU memory and the pipes.
      if (pid) signalGroup(pid, 'SIGKILL');
      // A grandchild that left the group may still hold the pipes: stop waiting for them after a moment.
      closeTimer = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
      }, 2000);
    });
    child.once('close', async () => {
      clearTimeout(closeTimer);
      clearTimeout(killTimer);
      signal.removeEventListener('abort', terminate);
      if (termAt !== undefined && pid) {
        const freed = (await groupGone(pid))
          ? 'its GPU memory is free'
          : 'its process group was sent SIGKILL but has not gone yet';
        job.stopped = killed
          ? `the trainer was killed (SIGKILL) after the ${duration(o.graceMs)} grace time; ${freed}`
          : `the trainer stopped on SIGTERM after ${duration(Date.now() - termAt)}; ${freed}`;
      }
      log.info('the trainer exited', { jobId: job.id, code: run.code, signal: run.signal, done: run.done });
      resolve(run);
    });
  });
}

// ─── the trainer's output ────────────────────────────────────────────────────

/** One line of the trainer's stdout: a protocol event, or a line kept as an event. */
function onStdout(line: string, run: TrainerRun, progress: Progress) {
  const text = visible(line);
  if (!text) return;
  const msg = parseLine(text);
  switch (msg?.event) {
    case 'start': {
      const steps = msg.steps;
      if (typeof steps === 'number' && Number.isInteger(steps) && steps >= 0) progress.setSteps(steps);
      progress.setMessage('training');
      return;
    }
    case 'step': {
      const point = toPoint(msg);
      if (point) progress.point(point);
      else progress.event('warn', `a step line without a usable step and loss: ${text}`);
      return;
    }
    case 'done':
      run.done = true;
      return;
    case 'error':
      run.error =
        typeof msg.message === 'string' && msg.message.trim()
          ? msg.message.trim()
          : 'the trainer reported an error without a message';
      return;
  }
  progress.event('info', text);
}

function onStderr(line: string, run: TrainerRun, progress: Progress) {
  const text = visible(line);
  if (!text) return;
  run.tail.push(text);
  if (run.tail.length > TAIL_LINES) run.tail.shift();
  // Info, not warn: the trainer writes its notes for the operator here (and the libraries' chatter with them).
  progress.event('info', text);
}

/** What a terminal would show of a line: the part after the last carriage return (progress bars redraw). */
function visible(line: string) {
  const parts = line.split('\r').filter((p) => p.trim());
  return (parts.at(-1) ?? '').trimEnd();
}

function parseLine(text: string): Record<string, unknown> | undefined {
  if (!text.startsWith('{')) return undefined;
  const parse = (s: string) => {
    try {
      const v = JSON.parse(s) as unknown;
      return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
    } catch {
      return undefined;
    }
  };
  // Python's json.dumps writes NaN and Infinity, which JSON has not: a diverging loss would otherwise turn a step
  // line into noise. Read as null, the step is reported as not usable instead.
  return parse(text) ?? parse(text.replace(/\bNaN\b|-?\bInfinity\b/g, 'null'));
}

function toPoint(m: Record<string, unknown>): TrainPoint | undefined {
  const finite = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
  if (!finite(m.step) || !Number.isInteger(m.step) || m.step < 0 || !finite(m.loss)) return undefined;
  return {
    step: m.step,
    loss: m.loss,
    lr: finite(m.lr) ? m.lr : null,
    peakMiB: finite(m.peak_mib) && m.peak_mib >= 0 ? Math.round(m.peak_mib) : null,
    tokensPerSecond: finite(m.tokens_per_s) && m.tokens_per_s >= 0 ? m.tokens_per_s : null,
    // The loss on the held-out pairs, on the lines of the steps the trainer evaluated at.
    ...(finite(m.eval_loss) ? { evalLoss: m.eval_loss } : {}),
  };
}

/** Why a finished trainer run failed, or undefined when it succeeded (said done and exited 0). */
export function trainerFailure(run: TrainerRun, trainer: string[]): string | undefined {
  if (run.spawnError)
    return `the trainer could not be started (${trainer.join(' ')}): ${run.spawnError}; set HANGAR_TRAINER to a command that runs it`;
  if (run.error) return run.error;
  const how = run.signal ? `was ended by ${run.signal}` : `exited with code ${run.code}`;
  if (run.done && run.code === 0) return undefined;
  const head = run.done ? `the trainer said done but ${how}` : `the trainer ${how} without saying done or error`;
  if (!run.tail.length) return head;
  // The end of stderr is what says why (the traceback's last line): cut from the front when it is long.
  const lead = `${head}; the last lines it wrote to stderr:\n`;
  const tail = run.tail.join('\n');
  const room = MESSAGE_MAX - lead.length;
  return lead + (tail.length > room ? `…${tail.slice(-(room - 1))}` : tail);
}

function signalGroup(pid: number, sig: NodeJS.Signals) {
  try {
    process.kill(-pid, sig);
  } catch {
    // ESRCH: the group has already gone.
  }
}

/** Whether no process of the group is left (waits up to a second for the kernel to reap them). */
async function groupGone(pid: number) {
  for (let i = 0; i < 50; i++) {
    try {
      process.kill(-pid, 0);
    } catch {
      return true;
    }
    await sleep(20);
  }
  return false;
}

export function duration(ms: number) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${Number((ms / 1000).toFixed(1))} s`;
}

export function messageOf(err: unknown) {
  return err instanceof Error ? err.message : String(err);
}
