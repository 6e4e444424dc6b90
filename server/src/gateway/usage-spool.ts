import { randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import fs, { type FileHandle } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import type { Logger } from '@hangar/common/log';

// Usage the database has not taken yet, on disk: a crash (kill -9, the OOM killer, a power cut) while PostgreSQL
// is away must not take with it what callers were answered, and will be billed for. How it holds:
//
// - Each server process appends to a file of its own, <HANGAR_DATA_DIR>/usage/<host>.<pid>.<generation>.ndjson,
//   one line a second at most: {"seq": n, "rows": [...]}, the usage rows gathered in that second, numbered from 1,
//   written and fdatasync'ed before the next second's (so a crash loses at most the second not yet written, and a
//   line torn by it is skipped on replay). The generation is a new id at every start.
// - PostgreSQL records, per generation, the last line it has taken (UsageSpool.appliedSeq), in the same
//   transaction that adds those lines' rows to UsageMinute. Whatever a crash interrupts (the append, the
//   transaction, its answer lost on the wire, the truncation of the file), a line is in UsageMinute exactly when
//   its seq is at most appliedSeq: a replay adds the lines after it, and only those.
// - A process that starts replays its host's files whose process is gone (the pid not running, or its own pid: in
//   a container every start is pid 1), then removes each file and its UsageSpool row. Files of other hosts (other
//   replicas on a shared data dir) are theirs: a host that never comes back leaves its file to be replayed by hand
//   (move it under a running host's name with a pid that is not running).
// - A file whose every line is in the database is emptied once it passes 1 MiB; while the database is away it
//   grows by a line a second (its distinct rows: callers × models × replicas), and empties once it is back.

/** A file whose lines are all in the database is emptied once it is this large. */
const TRUNCATE_AT_BYTES = 1024 * 1024;

/** One second's rows as they are written and read back: the minute travels as ISO text. */
export type SpooledRow = Record<string, unknown> & { minute: string };

export type Orphan = { file: string; generation: string };

const NAME = /^(.+)\.(\d+)\.([0-9a-f-]{36})\.ndjson$/;
/** Generations open in this process: two servers in one process (tests) on one data dir leave each other's be. */
const open = new Set<string>();

export class UsageSpool {
  readonly generation = randomUUID();
  private file: FileHandle | undefined;
  private bytes = 0;
  /** Appends and truncations, one after the other: a truncation must never cut a line being written. */
  private queue: Promise<void> = Promise.resolve();

  private readonly dir: string;
  private readonly log: Logger;

  /** `dir`: <HANGAR_DATA_DIR>/usage, one file per process. */
  constructor(deps: { dir: string; log: Logger }) {
    this.dir = deps.dir;
    this.log = deps.log;
  }

  private get host() {
    return os.hostname().replace(/[^A-Za-z0-9_-]/g, '_') || 'host';
  }

  /** Opens this process's file; the files of earlier processes on this host that died are returned to replay. */
  async open(): Promise<Orphan[]> {
    await fs.mkdir(this.dir, { recursive: true });
    const orphans: Orphan[] = [];
    for (const name of await fs.readdir(this.dir)) {
      const m = NAME.exec(name);
      if (!m || m[1] !== this.host) continue;
      const pid = Number(m[2]);
      if (pid !== process.pid && running(pid)) continue; // a live process on this host: its own
      if (open.has(m[3] as string)) continue;
      orphans.push({ file: path.join(this.dir, name), generation: m[3] as string });
    }
    this.file = await fs.open(path.join(this.dir, `${this.host}.${process.pid}.${this.generation}.ndjson`), 'a');
    open.add(this.generation);
    return orphans;
  }

  /** Writes one second's rows under `seq` and waits until they are on disk. */
  append(seq: number, rows: SpooledRow[]): Promise<void> {
    const line = Buffer.from(`${JSON.stringify({ seq, rows })}\n`);
    return this.enqueue(async (file) => {
      await file.write(line);
      await file.datasync();
      this.bytes += line.length;
    });
  }

  /** Empties the file when `allApplied()` still says every line in it is in the database, once it is large. */
  compact(allApplied: () => boolean): Promise<void> {
    if (this.bytes < TRUNCATE_AT_BYTES) return Promise.resolve();
    return this.enqueue(async (file) => {
      if (!allApplied()) return;
      await file.truncate(0);
      await file.datasync();
      this.bytes = 0;
    });
  }

  /** Closes the file, and removes it when every line in it is in the database (a clean stop); true if removed. */
  async close(allApplied: boolean): Promise<boolean> {
    await this.queue;
    const file = this.file;
    this.file = undefined;
    if (!file) return false;
    open.delete(this.generation);
    await file.close();
    if (!allApplied) return false;
    await this.remove(path.join(this.dir, `${this.host}.${process.pid}.${this.generation}.ndjson`));
    return true;
  }

  /** The lines of a file after `after`, read as they come (a long outage's file is not held whole). */
  async *linesAfter(file: string, after: number): AsyncGenerator<{ seq: number; rows: SpooledRow[] }> {
    const lines = createInterface({ input: createReadStream(file), crlfDelay: Number.POSITIVE_INFINITY });
    for await (const text of lines) {
      if (!text) continue;
      let line: { seq?: unknown; rows?: unknown };
      try {
        line = JSON.parse(text) as typeof line;
      } catch {
        // The line a crash cut short (the last one): its second is the one a crash may lose.
        this.log.warn('gateway: a usage spool line is cut short; skipped (a crash while it was written)', { file });
        continue;
      }
      if (typeof line.seq === 'number' && line.seq > after && Array.isArray(line.rows)) {
        yield { seq: line.seq, rows: line.rows as SpooledRow[] };
      }
    }
  }

  async remove(file: string): Promise<void> {
    await fs.rm(file, { force: true });
    // The removal itself must last: a file back after a power cut would be replayed as though it were new.
    const dir = await fs.open(this.dir, 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
  }

  private enqueue(step: (file: FileHandle) => Promise<void>): Promise<void> {
    const run = this.queue.then(async () => {
      if (this.file) await step(this.file);
    });
    // One failed write (a full disk) does not stop the ones after it.
    this.queue = run.catch(() => {});
    return run;
  }
}

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
