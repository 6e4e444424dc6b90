import type { Tx } from '../db/client.js';

// The write behind CatalogService.recordLastRequest: a model's last request and, for an on-demand one, how long it
// stays awake. A function of its own so the gateway's usage recorder can be tested with it without a whole catalog.

/** Where the write goes: the usage recorder's transaction (on the loops' connections). */
export type LastRequestDb = Pick<Tx, '$executeRawUnsafe'>;

// The idle clock of an on-demand model (min 0, max ≥ 1) runs from its last request: it stays awake until then
// plus its idle time. Never moved backwards (another replica may have written a later request).
const TOUCH = `
UPDATE "CatalogModel" AS c SET
  "lastRequestAt" = GREATEST(COALESCE(c."lastRequestAt", x.at), x.at),
  "awakeUntil" = CASE WHEN c."minReplicas" = 0 AND c."maxReplicas" > 0
    THEN GREATEST(COALESCE(c."awakeUntil", x.at), x.at + c."idleSeconds" * interval '1 second')
    ELSE c."awakeUntil" END
FROM (SELECT * FROM unnest($1::text[], $2::timestamp[]) AS u(name, at)) AS x
WHERE c.name = x.name`;

/** One statement for the whole batch, by model name; a name no model has any more is passed over. */
export async function recordLastRequest(
  db: LastRequestDb,
  lastRequests: readonly (readonly [model: string, at: Date])[],
): Promise<void> {
  if (!lastRequests.length) return;
  await db.$executeRawUnsafe(
    TOUCH,
    lastRequests.map(([m]) => m),
    lastRequests.map(([, at]) => at.toISOString()),
  );
}
