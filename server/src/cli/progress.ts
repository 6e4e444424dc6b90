import cliProgress from 'cli-progress';
import { bytes, duration, rate } from './format.js';

// One bar per watched thing, on stderr so that stdout stays what a script reads. The numbers come from the
// server (summed over a version's shards, its rate and ETA), not from a clock here: a watch started late shows
// the same figures as the console. Without a terminal, the same line is written every couple of seconds.

export type Figures = {
  label: string;
  done: number;
  /** Null while the total is unknown: then a count that only goes up, never an invented percentage. */
  total: number | null;
  unit: 'bytes' | 'steps';
  /** Per second, in the unit. */
  rate: number | null;
  etaSeconds: number | null;
  state: string;
  note?: string | null;
};

export class ProgressBar {
  private bar: cliProgress.SingleBar | undefined;
  private last: Figures | undefined;

  constructor(private readonly stream: NodeJS.WriteStream = process.stderr) {}

  update(f: Figures) {
    this.last = f;
    if (!this.bar) {
      this.bar = new cliProgress.SingleBar(
        {
          stream: this.stream,
          format: (options, params) => this.line(options, params.value),
          noTTYOutput: true,
          notTTYSchedule: 2000,
          hideCursor: this.stream.isTTY === true,
          // Redrawn on every event as well as on its own schedule; a bar at 100% is not "done" while verifying.
          stopOnComplete: false,
          clearOnComplete: false,
        },
        cliProgress.Presets.shades_classic,
      );
      this.bar.start(Math.max(1, f.total ?? 1), f.done);
    }
    this.bar.setTotal(Math.max(1, f.total ?? Math.max(1, f.done)));
    this.bar.update(f.done);
  }

  stop() {
    this.bar?.stop();
    this.bar = undefined;
  }

  private line(options: cliProgress.Options, value: number) {
    const f = this.last;
    if (!f) return '';
    const size = options.barsize ?? 30;
    const amount = (n: number | null) => (f.unit === 'bytes' ? bytes(n) : n == null ? '?' : String(n));
    const parts = [f.label];
    if (f.total != null && f.total > 0) {
      const share = Math.min(1, value / f.total);
      const filled = Math.round(share * size);
      parts.push(`[${'█'.repeat(filled)}${'░'.repeat(size - filled)}]`, `${(share * 100).toFixed(0).padStart(3)}%`);
      parts.push(`${amount(f.done)} of ${amount(f.total)}`);
    } else {
      parts.push(`${amount(f.done)} so far`);
    }
    if (f.rate != null && f.rate > 0)
      parts.push(f.unit === 'bytes' ? rate(f.rate) : `${f.rate.toFixed(f.rate < 1 ? 2 : 1)} steps/s`);
    if (f.etaSeconds != null) parts.push(`ETA ${duration(f.etaSeconds)}`);
    parts.push(f.state.toLowerCase());
    if (f.note) parts.push(`(${f.note})`);
    return parts.join('  ');
  }
}
