import { describeActor } from '../auth/viewer.js';
import type { Context } from '../context.js';
import type { Db, Tx } from '../db/client.js';
import type { AuditEvent } from '../generated/prisma/client.js';
import type { AuditOutcome } from '../generated/prisma/enums.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { notify } from '../pubsub.js';

export type AuditEntry = { action: string; target?: string | null; message?: string | null };
type Caller = Pick<Context, 'viewer' | 'requestId'>;

/** Which events a page holds: each given field must match (text anywhere in the value, any case). */
export type AuditFilter = {
  actor?: string | null;
  action?: string | null;
  target?: string | null;
  outcome?: AuditOutcome | null;
  from?: Date | null;
  to?: Date | null;
};

export class AuditService {
  constructor(
    private readonly db: Db,
    private readonly log: Logger,
  ) {}

  /** Records a change that happened: call inside the transaction that made it. */
  async done(tx: Tx, caller: Caller, entry: AuditEntry) {
    await this.write(tx, caller, entry, 'DONE');
  }

  async refused(caller: Caller, action: string, target: string | undefined, message: string) {
    await this.write(this.db, caller, { action, target, message }, 'REFUSED');
  }

  /**
   * A refusal that an anonymous caller can repeat at will (a sign-in guess): all those with the same key share
   * one row, whose `repeats` counts them and whose message is `message` with {n} replaced by that count. The
   * log shows the attack, one row per key, instead of growing by a row per request.
   */
  async refusedRepeated(caller: Caller, entry: AuditEntry & { message: string }, key: string) {
    const actor = describeActor(caller.viewer);
    try {
      const rows = await this.db.$queryRaw<{ id: bigint }[]>`
        INSERT INTO "AuditEvent" (actor, action, target, outcome, message, "requestId", "coalesceKey", repeats)
        VALUES (${actor}, ${entry.action}, ${entry.target ?? null}, 'REFUSED'::"AuditOutcome",
                replace(${entry.message}, '{n}', '1'), ${caller.requestId}, ${key}, 1)
        ON CONFLICT ("coalesceKey") DO UPDATE SET
          repeats = "AuditEvent".repeats + 1,
          message = replace(${entry.message}, '{n}', ("AuditEvent".repeats + 1)::text),
          "requestId" = excluded."requestId"
        RETURNING id`;
      const id = rows[0]?.id;
      if (id !== undefined) await notify(this.db, 'auditEvent', id.toString());
    } catch (err) {
      this.log.error('could not write audit event', { actor, ...entry, key, error: err });
    }
  }

  async failed(caller: Caller, action: string, target: string | undefined, message: string) {
    await this.write(this.db, caller, { action, target, message }, 'FAILED');
  }

  private async write(db: Db | Tx, caller: Caller, entry: AuditEntry, outcome: AuditOutcome) {
    const row = {
      actor: describeActor(caller.viewer),
      action: entry.action,
      target: entry.target ?? null,
      outcome,
      message: entry.message ?? null,
      requestId: caller.requestId,
    };
    try {
      const created = await db.auditEvent.create({ data: row, select: { id: true } });
      await notify(db, 'auditEvent', created.id.toString());
    } catch (err) {
      // A refusal must still reach the caller even when the audit write fails; the log keeps the record.
      if (outcome === 'DONE') throw err;
      this.log.error('could not write audit event', { ...row, error: err });
    }
  }

  async page(
    first: number,
    after?: bigint,
    filter: AuditFilter = {},
  ): Promise<Result<{ rows: AuditEvent[]; hasNextPage: boolean }, ValidationError>> {
    const { actor, action, target, outcome, from, to } = filter;
    if (from && to && from >= to) {
      return fail(
        new ValidationError(
          'filter.to',
          `filter.to: ${to.toISOString()} is not after filter.from (${from.toISOString()}); swap them, or leave one empty`,
        ),
      );
    }
    const contains = (v: string | null | undefined) =>
      v?.trim() ? { contains: v.trim(), mode: 'insensitive' as const } : undefined;
    const rows = await this.db.auditEvent.findMany({
      where: {
        id: after ? { lt: after } : undefined,
        actor: contains(actor),
        action: contains(action),
        target: contains(target),
        outcome: outcome ?? undefined,
        at: from || to ? { gte: from ?? undefined, lt: to ?? undefined } : undefined,
      },
      orderBy: { id: 'desc' },
      take: first + 1,
    });
    return ok({ rows: rows.slice(0, first), hasNextPage: rows.length > first });
  }
}
