import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

// A ticket that lets one node fetch one file from another (weights node to node): made by the control plane,
// checked by the serving node's agent with no call back, since the control plane may be the very thing that is
// busy or away. It is an HMAC-SHA256, not a JWT: both ends are Hangar, and a JWT library would add algorithms
// ("none", RSA confusions) that only one of would ever be used. Signed with the serving node's own key (NodePeer.key,
// given to its agent alone, over its node-token channel), so a node that leaks its key lets others into its own
// files only, never into another node's.

/** What a ticket says: the file (sha256), the node that may fetch it, the node it is for, and until when. */
export type PeerTicket = { sha256: string; asker: string; server: string; expiresAt: number };

/** A new node key: 256 random bits. `hgp_` so a leaked one is recognised for what it is. */
export function newPeerKey(): string {
  return `hgp_${randomBytes(32).toString('base64url')}`;
}

const mac = (key: string, payload: string) => createHmac('sha256', key).update(payload).digest('base64url');

/** `<payload>.<mac>`, both base64url: the payload is the ticket as JSON (sha256, asker, server, exp in seconds). */
export function signPeerTicket(key: string, t: PeerTicket): string {
  const payload = Buffer.from(
    JSON.stringify({ f: t.sha256, a: t.asker, s: t.server, e: Math.floor(t.expiresAt / 1000) }),
  ).toString('base64url');
  return `${payload}.${mac(key, payload)}`;
}

/**
 * The ticket when it is this key's, unexpired, for this file and this serving node; otherwise why not, in words
 * the serving agent can answer with (they say nothing of the key).
 */
export function checkPeerTicket(
  key: string,
  ticket: string,
  want: { sha256: string; server: string; nowMs: number },
): { ok: true; ticket: PeerTicket } | { ok: false; reason: string } {
  const [payload, sig, extra] = ticket.split('.');
  if (!payload || !sig || extra !== undefined) return { ok: false, reason: 'not a peer ticket' };
  const good = Buffer.from(mac(key, payload));
  const given = Buffer.from(sig);
  if (good.length !== given.length || !timingSafeEqual(good, given))
    return { ok: false, reason: 'the ticket is not signed for this node' };
  let body: { f?: unknown; a?: unknown; s?: unknown; e?: unknown };
  try {
    body = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
  } catch {
    return { ok: false, reason: 'not a peer ticket' };
  }
  if (
    typeof body.f !== 'string' ||
    typeof body.a !== 'string' ||
    typeof body.s !== 'string' ||
    typeof body.e !== 'number'
  )
    return { ok: false, reason: 'not a peer ticket' };
  const t: PeerTicket = { sha256: body.f, asker: body.a, server: body.s, expiresAt: body.e * 1000 };
  if (t.server !== want.server) return { ok: false, reason: 'the ticket is for another node' };
  if (t.sha256 !== want.sha256) return { ok: false, reason: 'the ticket is for another file' };
  if (t.expiresAt <= want.nowMs) return { ok: false, reason: 'the ticket has expired: ask the control plane again' };
  return { ok: true, ticket: t };
}
