import type { Tx } from '../db/client.js';

// Console sessions belong to auth (db/owners.ts). Access ends a user's sessions when it disables them or sets
// their password; it does so through this, in its own transaction, so the sessions end exactly when the change
// commits and not at all when it rolls back.

/** Ends every console session of a user, but `keep` (the session that asked, when it stays signed in). */
export async function endSessions(tx: Tx, userId: string, keep?: string): Promise<number> {
  const ended = await tx.session.deleteMany({ where: { userId, ...(keep ? { id: { not: keep } } : {}) } });
  return ended.count;
}
