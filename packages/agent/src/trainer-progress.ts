import type { Logger } from '@hangar/common/log';
import { backoffMs } from '@hangar/common/retry';
import { ControlPlaneError } from './control-plane.js';
import type { TrainEvent, TrainPoint, TrainProgressInput } from './train-control.js';
import { MESSAGE_MAX } from './trainer-process.js';

// ─── progress ────────────────────────────────────────────────────────────────

/** The control plane takes at most 10000 points and 200 events per report; kept well under. */
const POINTS_PER_REPORT = 1000;
const EVENTS_PER_REPORT = 100;
/** Lines kept while reports cannot get through; a chatty trainer's oldest lines go first. */
const EVENTS_KEPT = 1000;

export type ProgressOptions = {
  send: (input: TrainProgressInput) => Promise<void>;
  onRefused: (err: ControlPlaneError) => void;
  intervalMs: number;
  keepaliveMs: number;
  log: Logger;
  jobId: string;
};

/**
 * Coalesces a job's progress into reports: at most one in flight and one every intervalMs, each carrying every
 * point since the last (in order), an empty one every keepaliveMs to hold the lease. A report that does not get
 * through keeps its points for the next; one that is refused closes this and tells the worker.
 */
export class Progress {
  private points: TrainPoint[] = [];
  private events: TrainEvent[] = [];
  private leftOut = 0;
  private steps: number | undefined;
  private message: string | undefined;
  private lastAttempt = 0;
  private lastDelivered = Date.now();
  private failures = 0;
  private lastError: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private timerAt = 0;
  private sending: Promise<void> | undefined;
  private closed = false;
  private waiters: (() => void)[] = [];

  constructor(private readonly o: ProgressOptions) {
    this.schedule();
  }

  point(p: TrainPoint) {
    this.points.push(p);
    this.schedule();
  }

  event(level: TrainEvent['level'], message: string) {
    if (this.events.length >= EVENTS_KEPT) {
      this.events.shift();
      this.leftOut++;
    }
    this.events.push({
      level,
      message: message.length > MESSAGE_MAX ? `${message.slice(0, MESSAGE_MAX - 1)}…` : message,
    });
    this.schedule();
  }

  setSteps(steps: number) {
    this.steps = steps;
    this.schedule();
  }

  setMessage(message: string) {
    this.message = message;
    this.schedule();
  }

  /** Resolves once everything added so far has been delivered, or this closed (refused, or the job ended). */
  flush(): Promise<void> {
    if (this.closed || (!this.pending() && !this.sending)) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      this.schedule();
    });
  }

  /** The control plane is back: what did not get through is tried again now, not after the backoff. */
  retryNow() {
    if (this.closed || !this.failures) return;
    // The tries that failed did not reach it, so the interval between reports does not hold this one back.
    this.failures = 0;
    this.lastAttempt = 0;
    this.schedule();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const w of this.waiters.splice(0)) w();
  }

  private pending() {
    return (
      this.points.length > 0 ||
      this.events.length > 0 ||
      this.leftOut > 0 ||
      this.steps !== undefined ||
      this.message !== undefined
    );
  }

  private schedule() {
    if (this.closed || this.sending) return;
    const gap = this.failures
      ? backoffMs(this.failures, { baseMs: this.o.intervalMs, maxMs: this.o.keepaliveMs })
      : this.o.intervalMs;
    const at = this.pending()
      ? this.lastAttempt + gap
      : Math.max(this.lastDelivered + this.o.keepaliveMs, this.lastAttempt + gap);
    if (this.timer && this.timerAt <= at) return;
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.sending = this.sendOnce().finally(() => {
          this.sending = undefined;
          if (!this.pending()) for (const w of this.waiters.splice(0)) w();
          this.schedule();
        });
      },
      Math.max(0, at - Date.now()),
    );
  }

  private async sendOnce() {
    const points = this.points.slice(0, POINTS_PER_REPORT);
    const leftOut = this.leftOut;
    const events = this.events.slice(0, EVENTS_PER_REPORT - (leftOut ? 1 : 0));
    const { steps, message } = this;
    const input: TrainProgressInput = {};
    if (steps !== undefined) input.steps = steps;
    if (points.length) input.points = points;
    if (events.length || leftOut)
      input.events = [
        ...(leftOut
          ? [
              {
                level: 'warn' as const,
                message: `${leftOut} lines of the trainer's output were left out (too many while the control plane could not be reached)`,
              },
            ]
          : []),
        ...events,
      ];
    if (message !== undefined) input.message = message;
    this.lastAttempt = Date.now();
    try {
      await this.o.send(input);
    } catch (err) {
      if (err instanceof ControlPlaneError && err.kind === 'refused') {
        this.close();
        this.o.onRefused(err);
        return;
      }
      this.failures++;
      const msg = (err as Error).message;
      // Once per distinct reason: a control plane restarting for a minute should not write a line per try.
      if (msg !== this.lastError)
        this.o.log.warn('a progress report did not get through; keeping it to send again', {
          jobId: this.o.jobId,
          error: msg,
        });
      this.lastError = msg;
      return;
    }
    // Taken: drop what was sent. New points and lines were appended behind it; the events sent are removed by
    // identity, since a full buffer may have shifted older ones out meanwhile.
    this.points.splice(0, points.length);
    const sent = new Set(events);
    this.events = this.events.filter((e) => !sent.has(e));
    this.leftOut -= leftOut;
    if (this.steps === steps) this.steps = undefined;
    if (this.message === message) this.message = undefined;
    this.failures = 0;
    this.lastDelivered = Date.now();
    if (this.lastError) this.o.log.info('progress reports get through again', { jobId: this.o.jobId });
    this.lastError = undefined;
  }
}
