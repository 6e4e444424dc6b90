import type { Role } from '../generated/prisma/enums.js';

export type ViewerUser = { id: string; email: string; name: string; role: Role };

/** Who is calling, as every resolver and the audit log see it. */
export type Viewer =
  | { kind: 'user'; user: ViewerUser; role: Role; sessionId: string }
  | {
      kind: 'token';
      user: ViewerUser;
      role: Role;
      tokenId: string;
      tokenName: string;
      callerOnly?: boolean;
      /** Its requests go behind interactive ones (governance/limits-priority.ts). */
      batch?: boolean;
    }
  | { kind: 'node'; node: { id: string; name: string } }
  // Hangar acting on its own, for someone: a serve job's steps, say.
  | { kind: 'system'; name: string }
  // Why a caller is anonymous ("the token was revoked …") is kept so the refusal can say it.
  | { kind: 'anonymous'; reason?: string };

const rank: Record<Role, number> = { VIEWER: 1, OPERATOR: 2, ADMIN: 3 };

export function roleAtLeast(role: Role, needed: Role): boolean {
  return rank[role] >= rank[needed];
}

/** The lower of two roles: what a token may do when its user has since been demoted. */
export function lowerRole(a: Role, b: Role): Role {
  return rank[a] <= rank[b] ? a : b;
}

/**
 * Who a viewer is for the purpose of live connections and caps: the user behind a session or a token (so many
 * tokens of one user count as one caller), or the node. Undefined for callers that hold no credentials.
 */
export function credentialHolder(viewer: Viewer): string | undefined {
  if (viewer.kind === 'user' || viewer.kind === 'token') return `user:${viewer.user.id}`;
  if (viewer.kind === 'node') return `node:${viewer.node.id}`;
  return undefined;
}

export function viewerRole(viewer: Viewer): Role | undefined {
  return viewer.kind === 'user' || viewer.kind === 'token' ? viewer.role : undefined;
}
