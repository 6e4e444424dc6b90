import { describeActor } from '../auth/viewer.js';
import type { Context } from '../context.js';
import type { Db, Tx } from '../db/client.js';
import type { AuditOutcome } from '../generated/prisma/enums.js';
import type { Logger } from '../lib/log.js';
import { notify } from '../pubsub.js';

export type AuditEntry = { action: string; target?: string | null; message?: string | null };
type Caller = Pick<Context, 'viewer' | 'requestId'>;

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

  async page(first: number, after?: bigint) {
    const rows = await this.db.auditEvent.findMany({
      where: after ? { id: { lt: after } } : undefined,
      orderBy: { id: 'desc' },
      take: first + 1,
    });
    return { rows: rows.slice(0, first), hasNextPage: rows.length > first };
  }
}
