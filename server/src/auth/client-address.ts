/**
 * The address sign-in attempts are counted against. Without a proxy it is the socket's peer: X-Forwarded-For is
 * a header anyone can send, and trusting it would let a guesser pick a fresh address for every guess. Behind
 * a proxy (HANGAR_TRUST_PROXY) every peer is the proxy, so the last X-Forwarded-For entry is used: the one the
 * proxy itself appended; entries before it came from the client and are not believed.
 */
export function clientAddress(
  peer: string | undefined,
  forwardedFor: string | string[] | null | undefined,
  trustProxy: boolean,
): string | undefined {
  if (trustProxy && forwardedFor) {
    const header = Array.isArray(forwardedFor) ? forwardedFor.join(',') : forwardedFor;
    const last = header.split(',').at(-1)?.trim();
    if (last) return normalize(last);
  }
  return peer ? normalize(peer) : undefined;
}

// An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d; one client, one key.
function normalize(address: string): string {
  return address.replace(/^::ffff:(\d+\.\d+\.\d+\.\d+)$/, '$1').slice(0, 100);
}
