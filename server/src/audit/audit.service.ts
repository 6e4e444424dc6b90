import type { Logger } from '@hangar/common/log';
import { type Actor, describeActor, logFor } from '../auth/actor.js';
import type { Db, Tx } from '../db/client.js';
import type { AuditEvent } from '../generated/prisma/client.js';
import type { AuditOutcome } from '../generated/prisma/enums.js';
import { fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { notify } from '../pubsub.js';

export type AuditEntry = {
  action: string;
  target?: string | null;
  message?: string | null;
  /**
   * The owner (scope:id) of what the row is about: an owned job, adapter or model. The row is then shown only to
   * those that owner admits, and admins (org-owners.ts `sees`), as the thing itself is. Absent: everyone's.
   */
  owner?: string | null;
};

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
  async done(tx: Tx, actor: Actor, entry: AuditEntry) {
    await this.write(tx, actor, entry, 'DONE');
  }

  /** `owner`: of the thing refused, only where the caller may see it (a refusal's row reads as the thing does). */
  async refused(actor: Actor, action: string, target: string | undefined, message: string, owner?: string | null) {
    await this.write(this.db, actor, { action, target, message, owner }, 'REFUSED');
  }

  /**
   * A refusal that an anonymous caller can repeat at will (a sign-in guess): all those with the same key share
   * one row, whose `repeats` counts them and whose message is `message` with {n} replaced by that count. The
   * log shows the attack, one row per key, instead of growing by a row per request. `count`: that many at once
   * (the limits' refusals, counted in memory and written every few seconds).
   */
  async refusedRepeated(actor: Actor, entry: AuditEntry & { message: string }, key: string, count = 1) {
    const named = describeActor(actor);
    try {
      const rows = await this.db.$queryRaw<{ id: bigint }[]>`
        INSERT INTO "AuditEvent" (actor, action, target, outcome, message, "requestId", "coalesceKey", repeats)
        VALUES (${named}, ${entry.action}, ${entry.target ?? null}, 'REFUSED'::"AuditOutcome",
                replace(${entry.message}, '{n}', ${count}::int::text), ${actor.requestId}, ${key}, ${count}::int)
        ON CONFLICT ("coalesceKey") DO UPDATE SET
          repeats = "AuditEvent".repeats + ${count}::int,
          message = replace(${entry.message}, '{n}', ("AuditEvent".repeats + ${count}::int)::text),
          "requestId" = excluded."requestId"
        RETURNING id`;
      const id = rows[0]?.id;
      if (id !== undefined) await notify(this.db, 'auditEvent', id.toString());
    } catch (err) {
      logFor(this.log, actor).error('could not write audit event', { actor: named, ...entry, key, error: err });
    }
  }

  async failed(actor: Actor, action: string, target: string | undefined, message: string, owner?: string | null) {
    await this.write(this.db, actor, { action, target, message, owner }, 'FAILED');
  }

  private async write(db: Db | Tx, actor: Actor, entry: AuditEntry, outcome: AuditOutcome) {
    const row = {
      actor: describeActor(actor),
      action: entry.action,
      target: entry.target ?? null,
      outcome,
      message: entry.message ?? null,
      requestId: actor.requestId,
      owner: entry.owner ?? null,
    };
    try {
      const created = await db.auditEvent.create({ data: row, select: { id: true } });
      await notify(db, 'auditEvent', created.id.toString());
    } catch (err) {
      // A refusal must still reach the caller even when the audit write fails; the log keeps the record.
      if (outcome === 'DONE') throw err;
      logFor(this.log, actor).error('could not write audit event', { ...row, error: err });
    }
  }

  /**
   * A page of rows, newest first. `owners` (org-owners.ts seenOwners): only rows about nothing owned or about
   * these owners' things, chosen in the query so a page is neither cut short nor padded by rows the caller may
   * not see; absent (an admin): every row.
   */
  async page(
    first: number,
    after?: bigint,
    filter: AuditFilter = {},
    owners?: string[],
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
        ...(owners ? { OR: [{ owner: null }, { owner: { in: owners } }] } : {}),
      },
      orderBy: { id: 'desc' },
      take: first + 1,
    });
    return ok({ rows: rows.slice(0, first), hasNextPage: rows.length > first });
  }
}
