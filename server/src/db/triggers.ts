import { createHash } from 'node:crypto';
import { backoffMs, sleep } from '@hangar/common/retry';
import type { Db, Tx } from './client.js';

// Five domains keep rows in step with triggers (model events, serving work, GPU time, usage rollups, served
// names), installed at every start rather than by a migration (model-events.ts says why). Replacing a trigger
// takes an ACCESS EXCLUSIVE lock on its table, and a replica or worker starting beside running servers then
// waits behind their transactions while holding the lock on the table before — PostgreSQL ended one of them as
// a deadlock (40P01) when HANGAR_WORKERS started two workers at once. So each trigger carries a comment naming
// the digest of what was installed, and a start that finds every trigger with this build's digest changes
// nothing and takes no lock: only the first start of a new version replaces anything.

export interface TriggerSet {
  /** The advisory lock that serialises replicas replacing this set. */
  lock: number;
  /** The functions' CREATE OR REPLACE statements, one statement each, in order. */
  functions: readonly string[];
  /** Each trigger, by its name and table, and the CREATE TRIGGER statement that makes it. */
  triggers: readonly { name: string; table: string; create: string }[];
  /** Brings rows written before this version's triggers up to date, in the transaction that installs them. */
  catchUp?: (tx: Tx) => Promise<void>;
}

const TRIES = 4;

/** Installs the set unless the database already has exactly it. Says whether it installed anything. */
export async function installTriggers(db: Db, set: TriggerSet): Promise<boolean> {
  const tag = `hangar ${digest(set)}`;
  if (await installed(db, set, tag)) return false;
  for (let attempt = 0; ; attempt++) {
    try {
      return await db.$transaction(
        async (tx) => {
          await tx.$executeRaw`SELECT pg_advisory_xact_lock(${set.lock})`;
          // Another replica may have installed this very version while this one waited for the lock.
          if (await installed(tx, set, tag)) return false;
          for (const statement of set.functions) await tx.$executeRawUnsafe(statement);
          for (const t of set.triggers) {
            await tx.$executeRawUnsafe(`DROP TRIGGER IF EXISTS "${t.name}" ON "${t.table}"`);
            await tx.$executeRawUnsafe(t.create);
            await tx.$executeRawUnsafe(`COMMENT ON TRIGGER "${t.name}" ON "${t.table}" IS '${tag}'`);
          }
          await set.catchUp?.(tx);
          return true;
        },
        { timeout: 60_000 },
      );
    } catch (err) {
      // A new version starting beside servers of the old one can still meet their transactions; the one
      // PostgreSQL chose to end is tried again rather than failing the start.
      if (!isDeadlock(err) || attempt + 1 >= TRIES) throw err;
      await sleep(backoffMs(attempt, { baseMs: 100, maxMs: 2000, jitter: 0.5 }));
    }
  }
}

async function installed(db: Db | Tx, set: TriggerSet, tag: string): Promise<boolean> {
  const names = set.triggers.map((t) => t.name);
  const rows = await db.$queryRaw<{ n: number }[]>`
    SELECT count(*)::int AS n FROM pg_trigger t
    JOIN pg_description d ON d.objoid = t.oid AND d.classoid = 'pg_trigger'::regclass
    WHERE NOT t.tgisinternal AND t.tgname = ANY(${names}) AND d.description = ${tag}`;
  return rows[0]?.n === names.length;
}

function digest(set: TriggerSet): string {
  return createHash('sha256')
    .update(JSON.stringify([set.functions, set.triggers]))
    .digest('hex')
    .slice(0, 32);
}

/** PostgreSQL's "deadlock detected" (40P01), however Prisma and its adapter wrap it. */
export function isDeadlock(err: unknown, depth = 0): boolean {
  if (!err || typeof err !== 'object' || depth > 5) return false;
  const o = err as { code?: unknown; message?: unknown; cause?: unknown; meta?: { driverAdapterError?: unknown } };
  if (o.code === '40P01') return true;
  if (typeof o.message === 'string' && /deadlock detected|40P01/.test(o.message)) return true;
  return isDeadlock(o.cause, depth + 1) || isDeadlock(o.meta?.driverAdapterError, depth + 1);
}
