import type { GraphQLResolveInfo } from 'graphql';
import type { Viewer } from '../auth/viewer.js';
import { type Sight, seenOwners, sees } from './org-owners.js';

// GraphQL's side of the one rule for owned things (org-owners.ts `sees`): what a caller may not call at /v1 it
// cannot see here either, on any field, list, lookup or subscription. The caller's sight comes from the gateway's
// kept reach (gateway/callers.ts), which a membership change drops at once on every server replica.

type SightCtx = { viewer: Viewer; services: { gateway: { callers: { sight(viewer: Viewer): Promise<Sight> } } } };

type Kept = { loading: Promise<Sight>; loaded?: Sight };
const perOperation = new WeakMap<object, Kept>();

/**
 * The caller's sight. Kept on a query's or mutation's context, so a list of 5000 rows asks once; a subscription's
 * context lives as long as the subscription, so each of its events asks afresh (from the gateway's kept reach:
 * no database round-trip unless a membership changed).
 */
export function sightOf(ctx: SightCtx, info?: Pick<GraphQLResolveInfo, 'operation'>): Promise<Sight> {
  if (!info || info.operation.operation === 'subscription') return ctx.services.gateway.callers.sight(ctx.viewer);
  let kept = perOperation.get(ctx);
  if (!kept) {
    const entry: Kept = { loading: ctx.services.gateway.callers.sight(ctx.viewer) };
    entry.loading.then((s) => (entry.loaded = s)).catch(() => {});
    perOperation.set(ctx, entry);
    kept = entry;
  }
  return kept.loading;
}

/**
 * The sight a query has already loaded (sightOf awaited by the field above), so a field under a list of thousands
 * answers at once rather than as a promise each (the Mirror page's usedBy: bench/mirror-query.ts).
 */
export function sightLoaded(ctx: SightCtx, info: Pick<GraphQLResolveInfo, 'operation'>): Sight | undefined {
  return info.operation.operation === 'subscription' ? undefined : perOperation.get(ctx)?.loaded;
}

/** A Prisma filter on a row's `owner` column that keeps what the sight sees; nothing for an admin. */
export function ownerFilter(sight: Sight): { OR: ({ owner: null } | { owner: { in: string[] } })[] } | undefined {
  const owners = seenOwners(sight);
  return owners ? { OR: [{ owner: null }, { owner: { in: owners } }] } : undefined;
}

/** The items of a list whose owner the sight sees (admins: the list itself). */
export function seenOnly<T>(sight: Sight, items: T[], ownerOf: (item: T) => string | null): T[] {
  return sight.admin ? items : items.filter((item) => sees(sight, ownerOf(item)));
}

export { sees };
