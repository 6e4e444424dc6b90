import { Prisma } from '../generated/prisma/client.js';
import type { Db, Tx } from './client.js';

// Work that several server replicas share (files to mirror, serve jobs, smoke tests) is handed out by leases in
// PostgreSQL rather than by a job queue beside it: the row the console shows *is* the work item, so its state,
// its progress and who holds it can never disagree with a queue's copy. A lease is a deadline in the row: its
// holder pushes it on while it works, and when a replica dies the deadline passes and another takes the row up.
//
// Kept here rather than in graphile-worker or pg-boss: both keep jobs in tables of their own, with their own
// migrations and a LISTEN connection per process, and the mirror and the serve job would still need their rows
// (a partial's bytes, a job's steps) kept in step with the queue's. What they would add (cron, retries with
// backoff, fan-out) the mirror already does per file, and the serve job resumes at the step it was on.

/**
 * Where a kind of work keeps its lease. Column names are written into the SQL as identifiers, so they are fixed
 * per queue in code, never taken from input.
 */
export type LeaseQueueSpec = {
  table: string;
  /** How long a claim or a renewal holds the row; a holder renews well before it runs out (every third). */
  leaseMs: number;
  /** The deadline's column; "leaseUntil" unless said. */
  untilColumn?: string;
  /** The holder's column; "leaseOwner" unless said. null: the lease has no holder column (a smoke test's). */
  ownerColumn?: string | null;
  /** A column every claim, renewal and release sets to now(), as Prisma's @updatedAt would ("updatedAt"). */
  touchColumn?: string;
};

export type ClaimOptions = {
  /** Which rows may be taken: waiting ones, and those whose holder's lease ran out (see `expired`). */
  claimable: Prisma.Sql;
  /** Which comes first among them; the oldest, usually. */
  order: Prisma.Sql;
  /** Further columns the claim sets in the same statement (a state, an attempt count). */
  set?: Prisma.Sql;
  /** The columns the claim hands back, besides the row's id. */
  returning?: Prisma.Sql;
};

export class LeaseQueue {
  readonly leaseMs: number;
  private readonly table: Prisma.Sql;
  private readonly until: Prisma.Sql;
  private readonly owner: Prisma.Sql | null;
  private readonly touch: Prisma.Sql;

  constructor(spec: LeaseQueueSpec) {
    this.leaseMs = spec.leaseMs;
    this.table = Prisma.raw(`"${spec.table}"`);
    this.until = Prisma.raw(`"${spec.untilColumn ?? 'leaseUntil'}"`);
    const owner = spec.ownerColumn === undefined ? 'leaseOwner' : spec.ownerColumn;
    this.owner = owner === null ? null : Prisma.raw(`"${owner}"`);
    this.touch = spec.touchColumn ? Prisma.raw(`, "${spec.touchColumn}" = now()`) : Prisma.empty;
  }

  /**
   * The deadline a claim or a renewal made now sets, for writes that go through Prisma's own calls. `from` is the
   * database's now (db.clock.now()): the deadline is compared with now() in SQL, never with this server's clock.
   */
  deadline(from: Date): Date {
    return new Date(from.getTime() + this.leaseMs);
  }

  /** Rows whose lease ran out: their holder stopped renewing (it crashed, or its replica went away). */
  expired(options: { orNone?: boolean } = {}): Prisma.Sql {
    return options.orNone
      ? Prisma.sql`(${this.until} IS NULL OR ${this.until} < now())`
      : Prisma.sql`${this.until} < now()`;
  }

  /**
   * Takes the first claimable row for `holder`, atomically: SKIP LOCKED lets replicas claiming at the same
   * moment each get a different row instead of waiting on (or both taking) the same one. null when none is free.
   */
  async claim<Row extends { id: string } = { id: string }>(
    db: Db | Tx,
    holder: string | null,
    options: ClaimOptions,
  ): Promise<Row | null> {
    const owner = this.owner ? Prisma.sql`${this.owner} = ${holder}, ` : Prisma.empty;
    const set = options.set ? Prisma.sql`, ${options.set}` : Prisma.empty;
    const returning = options.returning ? Prisma.sql`, ${options.returning}` : Prisma.empty;
    const rows = await db.$queryRaw<Row[]>`
      UPDATE ${this.table} SET ${owner}${this.until} = now() + ${`${this.leaseMs} milliseconds`}::interval${this.touch}${set}
      WHERE id = (SELECT id FROM ${this.table} WHERE (${options.claimable})
                  ORDER BY ${options.order} LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING id${returning}`;
    return rows[0] ?? null;
  }

  /**
   * Pushes the holder's deadline on. False when the row is no longer the holder's (released, taken over after
   * its lease ran out, or no longer matching `still`): the holder must stop working on it.
   */
  async renew(db: Db | Tx, id: string, holder: string, still?: Prisma.Sql): Promise<boolean> {
    const also = still ? Prisma.sql` AND ${still}` : Prisma.empty;
    const updated = await db.$executeRaw`
      UPDATE ${this.table} SET ${this.until} = now() + ${`${this.leaseMs} milliseconds`}::interval${this.touch}
      WHERE id = ${id}::uuid AND ${this.ownerColumn()} = ${holder}${also}`;
    return updated === 1;
  }

  /**
   * Gives the row up (with `set`, the state it is left in). Only its holder can: a replica whose lease ran out
   * and was taken over must not undo the new holder's claim. False when it was not the holder's.
   */
  async release(db: Db | Tx, id: string, holder: string, set?: Prisma.Sql): Promise<boolean> {
    const more = set ? Prisma.sql`, ${set}` : Prisma.empty;
    const updated = await db.$executeRaw`
      UPDATE ${this.table} SET ${this.ownerColumn()} = NULL, ${this.until} = NULL${this.touch}${more}
      WHERE id = ${id}::uuid AND ${this.ownerColumn()} = ${holder}`;
    return updated === 1;
  }

  private ownerColumn(): Prisma.Sql {
    if (!this.owner) throw new Error(`${this.table.sql}'s lease has no holder column to renew or release by`);
    return this.owner;
  }
}
