/**
 * Why a sign-in should be refused as coming from another site, or undefined when it may go on. A page
 * elsewhere can post a login form to Hangar (a plain form needs no CORS) and sign the operator's browser in as
 * the attacker, whose session then records what the operator does. Browsers say where a request comes from;
 * scripts send neither header and stay allowed (they must know a password anyway).
 */
export function crossSiteSignIn(
  headers: Headers,
  allowed: { publicUrl: string | undefined; corsOrigins: readonly string[] },
): string | undefined {
  const origin = headers.get('origin');
  const fetchSite = headers.get('sec-fetch-site');
  const refusal = (from: string) =>
    `sign-in refused: the request came from ${from}, not from Hangar's own pages; sign in on the console itself, or list the origin in HANGAR_CORS_ORIGINS`;
  if (origin) {
    if (isOwnOrigin(origin, headers.get('host'), allowed)) return undefined;
    return refusal(origin === 'null' ? 'a page with a hidden origin' : origin);
  }
  // Another port of this host is "same-site" but another origin, with the same cookies: refused as well.
  if (fetchSite === 'cross-site' || fetchSite === 'same-site') return refusal(`a ${fetchSite} page`);
  return undefined;
}

/** Whether a browser's Origin is Hangar's own (its Host, HANGAR_PUBLIC_URL) or one HANGAR_CORS_ORIGINS lists. */
export function isOwnOrigin(
  origin: string,
  host: string | null,
  allowed: { publicUrl: string | undefined; corsOrigins: readonly string[] },
): boolean {
  let o: URL;
  try {
    o = new URL(origin);
  } catch {
    return false;
  }
  if (allowed.corsOrigins.includes(o.origin)) return true;
  if (allowed.publicUrl && o.origin === new URL(allowed.publicUrl).origin) return true;
  return Boolean(host) && o.host === host;
}
