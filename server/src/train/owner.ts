import type { Viewer } from '../auth/viewer.js';
import type { Tx } from '../db/client.js';
import type { OwnerScope } from '../generated/prisma/enums.js';
import type { Result } from '../lib/errors.js';
import type { Sight } from '../org/org-owners.js';

/**
 * What training needs of the organisation (server/src/org): who an owner string names, and whether that owner
 * may read a knowledge-base collection. An interface, so the rules live in one place and training only asks.
 */
export interface OwnerRules {
  /** "org:acme", "team:acme/research", "project:acme/research/bots", "user:ana@example.com", "key:<id>" or ids. */
  resolveOwner(owner: string, opts?: { db?: Tx }): Promise<Result<{ scope: OwnerScope; id: string; label: string }>>;
  canRead(owner: { scope: OwnerScope; id: string }, collectionId: string): Promise<boolean>;
  /** Whether a signed-in caller may read what a stored owner key owns (null: public); see OrgService.mayRead. */
  mayRead(viewer: Viewer, owner: string | null): Promise<boolean>;
  /** What a caller may see and call of owned things (OrgService.sightOf; judged by org-owners.ts `sees`). */
  sightOf(viewer: Viewer): Promise<Sight>;
  collection(id: string): Promise<{ id: string; name: string; ownerScope: OwnerScope; ownerId: string } | null>;
}
