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
