import type { Db } from '../db/client.js';

// The shared side of a limit's budget: one LimitWindow row per limit, kind and window, holding what every server
// process has settled (`used`) and what they hold in slices and have not settled yet (`leased`). A process asks
// for a slice with one statement that locks the row, so two processes asking at once are served one after the
// other and used + leased never passes the limit: that sum is the promise that the budget holds across processes.
// Only slices cross this line, never single requests: the request path reads and writes memory
// (limits-enforcer.ts), and comes here when its slice is spent.

export type WindowKey = { limitId: string; kind: string; start: Date };
export type Lease = { granted: number; used: number; leased: number };

export class LimitLedger {
  constructor(private readonly deps: { db: Db }) {}

  /** Up to `want` more of the window's budget `cap` for this process; granted 0 when none is left. */
  async lease(key: WindowKey, want: number, cap: number): Promise<Lease> {
    const db = this.deps.db.loops;
    const w = BigInt(Math.max(0, Math.ceil(want)));
    const c = BigInt(Math.max(0, Math.floor(cap)));
    await db.$executeRaw`
      INSERT INTO "LimitWindow" ("limitId", kind, start) VALUES (${key.limitId}::uuid, ${key.kind}, ${key.start})
      ON CONFLICT DO NOTHING`;
    // The CTE locks the row and reads its latest totals; the grant is worked out from those alone, so a grant made
    // by another process a moment before is counted (READ COMMITTED re-reads a locked row).
    const rows = await db.$queryRaw<{ used: bigint; leased: bigint; granted: bigint }[]>`
      WITH cur AS (
        SELECT used, leased, LEAST(${w}::bigint, GREATEST(0, ${c}::bigint - used - leased)) AS g
        FROM "LimitWindow"
        WHERE "limitId" = ${key.limitId}::uuid AND kind = ${key.kind} AND start = ${key.start}
        FOR UPDATE
      )
      UPDATE "LimitWindow" w SET leased = cur.leased + cur.g
      FROM cur
      WHERE w."limitId" = ${key.limitId}::uuid AND w.kind = ${key.kind} AND w.start = ${key.start}
      RETURNING w.used, w.leased, cur.g AS granted`;
    const row = rows[0];
    if (!row) return { granted: 0, used: 0, leased: 0 };
    return { granted: Number(row.granted), used: Number(row.used), leased: Number(row.leased) };
  }

  /**
   * Settles part of this process's slice: `spent` becomes used, and `released` (spent plus what it gives back
   * unused) leaves leased. Spent may pass what was leased (a request that used more than it reserved): then used
   * grows past the cap by that much, which is the overshoot docs/architecture.md bounds.
   */
  async settle(key: WindowKey, spent: number, released: number): Promise<{ used: number; leased: number }> {
    const rows = await this.deps.db.loops.$queryRaw<{ used: bigint; leased: bigint }[]>`
      UPDATE "LimitWindow"
      SET used = used + ${BigInt(Math.max(0, Math.round(spent)))}::bigint,
          leased = GREATEST(0, leased - ${BigInt(Math.max(0, Math.round(released)))}::bigint)
      WHERE "limitId" = ${key.limitId}::uuid AND kind = ${key.kind} AND start = ${key.start}
      RETURNING used, leased`;
    const row = rows[0];
    return { used: Number(row?.used ?? 0), leased: Number(row?.leased ?? 0) };
  }

  /** What every process has settled of the current windows, for the Limits page: by limit id, kind and start. */
  async totals(keys: WindowKey[]): Promise<Map<string, { used: number; leased: number }>> {
    const out = new Map<string, { used: number; leased: number }>();
    if (!keys.length) return out;
    const rows = await this.deps.db.limitWindow.findMany({
      where: { OR: keys.map((k) => ({ limitId: k.limitId, kind: k.kind, start: k.start })) },
    });
    for (const r of rows)
      out.set(`${r.limitId}|${r.kind}|${r.start.getTime()}`, { used: Number(r.used), leased: Number(r.leased) });
    return out;
  }

  /** Windows long over are history nobody reads: dropped now and then (a minute's after a day, a day's after two). */
  async prune(nowMs: number): Promise<void> {
    const day = 86_400_000;
    await this.deps.db.loops.limitWindow.deleteMany({
      where: {
        OR: [
          { kind: { in: ['requestsPerMinute', 'tokensPerMinute'] }, start: { lt: new Date(nowMs - day) } },
          { kind: 'tokensPerDay', start: { lt: new Date(nowMs - 2 * day) } },
          { kind: { in: ['tokensPerMonth', 'spendPerMonth'] }, start: { lt: new Date(nowMs - 62 * day) } },
        ],
      },
    });
  }
}
