// The console's session rides in an HttpOnly cookie that scripts on the page cannot read; the CSRF token rides
// in a readable cookie that the console copies into a header, which a page on another site cannot do.
export const SESSION_COOKIE = 'hangar_session';
export const CSRF_COOKIE = 'hangar_csrf';
export const CSRF_HEADER = 'x-hangar-csrf';

export function parseCookies(header: string | null | undefined): Map<string, string> {
  const out = new Map<string, string>();
  if (!header) return out;
  for (const part of header.split(';')) {
    const i = part.indexOf('=');
    if (i < 0) continue;
    const name = part.slice(0, i).trim();
    const value = part.slice(i + 1).trim();
    try {
      out.set(name, decodeURIComponent(value));
    } catch {
      // A malformed cookie from elsewhere on the domain is not ours to fail on.
    }
  }
  return out;
}

type CookieOptions = { httpOnly: boolean; secure: boolean; maxAgeSeconds: number };

export function serializeCookie(name: string, value: string, o: CookieOptions): string {
  const parts = [`${name}=${encodeURIComponent(value)}`, 'Path=/', 'SameSite=Lax', `Max-Age=${o.maxAgeSeconds}`];
  if (o.httpOnly) parts.push('HttpOnly');
  if (o.secure) parts.push('Secure');
  return parts.join('; ');
}

/**
 * The two cookies of a console session that a sign-in opened (AuthService.login): the session itself, which
 * scripts cannot read, and the CSRF token, which the console copies into its header. Services return the
 * session; setting cookies is the edge's part.
 */
export function sessionCookies(
  session: { secret: string; csrfToken: string; maxAgeSeconds: number },
  secure: boolean,
): string[] {
  const { secret, csrfToken, maxAgeSeconds } = session;
  return [
    serializeCookie(SESSION_COOKIE, secret, { httpOnly: true, secure, maxAgeSeconds }),
    serializeCookie(CSRF_COOKIE, csrfToken, { httpOnly: false, secure, maxAgeSeconds }),
  ];
}

/** The same two cookies, emptied and expired at once: what a sign-out sends. */
export function clearedSessionCookies(secure: boolean): string[] {
  return [
    serializeCookie(SESSION_COOKIE, '', { httpOnly: true, secure, maxAgeSeconds: 0 }),
    serializeCookie(CSRF_COOKIE, '', { httpOnly: false, secure, maxAgeSeconds: 0 }),
  ];
}
