import { z } from 'zod';
import type { Viewer, ViewerUser } from './viewer.js';

// The shapes credentials take between the edge and AuthService: what a sign-in and a password change accept,
// what a request shows, the session a sign-in opens, what a lookup found, and a user as a viewer holds it.

export const loginInput = z.object({
  email: z.string().trim().toLowerCase().email('an email address'),
  password: z.string().min(1, 'the password is empty').max(1024, 'at most 1024 characters'),
});

export const changePasswordInput = z.object({
  currentPassword: z.string().min(1, 'your current password, to show it is you at the keyboard').max(1024),
  newPassword: z.string().min(12, 'at least 12 characters').max(1024, 'at most 1024 characters'),
});

export type Credentials = {
  authorization?: string | null;
  cookie?: string | null;
  csrf?: string | null;
  method: string;
  /**
   * What the credentials are shown for: the control plane (GraphQL, /mirror, /api; the default) or calling
   * models at /v1. A caller-only token stands only for the second.
   */
  purpose?: 'control' | 'call';
  /**
   * Looked up in the database past any answer kept for a few seconds: for the checks of live connections
   * (auth/live.ts), which exist to catch what no event announced.
   */
  fresh?: boolean;
};

/**
 * A session a sign-in opened: the edge hands the secret and the CSRF token to the browser (as cookies, for
 * GraphQL: auth/cookies.ts's sessionCookies); the service only keeps their hashes and the expiry.
 */
export type OpenedSession = { secret: string; csrfToken: string; maxAgeSeconds: number };

/** What a token's lookup found: the token as it stands, or why it does not. */
export type TokenFound =
  | {
      ok: true;
      user: ViewerUser;
      token: {
        id: string;
        name: string;
        role: ViewerUser['role'];
        callerOnly: boolean;
        batch: boolean;
        expiresAt: Date | null;
      };
    }
  | { ok: false; viewer: Viewer };

/** What a session's lookup found; the CSRF header is checked against it on every request, hit or not. */
export type SessionFound =
  | { ok: true; user: ViewerUser; sessionId: string; csrfToken: string; expiresAt: Date }
  | { ok: false; viewer: Viewer };

export function toViewerUser(u: { id: string; email: string; name: string; role: ViewerUser['role'] }): ViewerUser {
  return { id: u.id, email: u.email, name: u.name, role: u.role };
}
