// The server's session cookie is HttpOnly; its CSRF token rides in a readable cookie that the console copies into
// a header on every request (server/src/auth/cookies.ts). Without the header the server treats us as anonymous.
export const CSRF_COOKIE = 'hangar_csrf';
export const CSRF_HEADER = 'x-hangar-csrf';

export function readCookie(name: string, cookies: string = document.cookie): string | undefined {
  for (const part of cookies.split(';')) {
    const i = part.indexOf('=');
    if (i < 0 || part.slice(0, i).trim() !== name) continue;
    try {
      return decodeURIComponent(part.slice(i + 1).trim());
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/** Read at request time: the cookie changes when someone signs in or out in another tab. */
export function csrfHeaders(cookies?: string): Record<string, string> {
  const token = readCookie(CSRF_COOKIE, cookies);
  return token ? { [CSRF_HEADER]: token } : {};
}
