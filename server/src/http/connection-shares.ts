import type http from 'node:http';
import type { Socket } from 'node:net';
import type { Logger } from '@hangar/common/log';
import { clientAddress } from '../auth/client-address.js';

// HANGAR_MAX_CONNECTIONS alone was one pool anybody could drain: one client trickling headers on a few hundred
// sockets, or holding idle WebSockets, left nothing for anyone else, /v1 included. Here every client address gets
// a share of the pool, and connections that have not sent a request's headers yet (new ones, and kept-alive ones
// between requests) share a smaller budget, so slots stay free for requests that have arrived. Callers' shares of
// WebSockets and SSE streams are kept where callers are known (auth/live.ts).

export type ConnectionShareLimits = {
  /** Connections the server holds at once (HANGAR_MAX_CONNECTIONS). */
  total: number;
  /** Connections one client address may hold at once. */
  perAddress: number;
  /** Connections that have not sent a whole request's headers yet, from all addresses together. */
  pending: number;
};

/**
 * How long a connection may wait for its headers before another may take its place. A real client sends them
 * with its first packet, but a busy server reads them later: a burst of a thousand clients connecting at once
 * (agents after a restart) must not close its own first arrivals before the server has read what they sent.
 */
const PENDING_GRACE_MS = 1000;

export class ConnectionShares {
  private readonly byAddress = new Map<string, number>();
  /** Every connection held, and its address. */
  private readonly held = new Map<Socket, string>();
  /** Connections waiting for headers, and since when; a Map keeps insertion order, so the oldest is first. */
  private readonly pending = new Map<Socket, number>();
  private lastWarned = 0;

  constructor(
    private readonly limits: ConnectionShareLimits,
    private readonly log: Logger,
  ) {}

  /** Hooks the server's connection and request events; the server itself sets no maxConnections. */
  attach(server: http.Server): void {
    server.on('connection', (socket: Socket) => this.connected(socket));
    server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => this.requestArrived(req, res));
    server.on('upgrade', (req: http.IncomingMessage) => this.pending.delete(req.socket));
  }

  private connected(socket: Socket): void {
    const address = addressOf(socket);
    const fromAddress = this.byAddress.get(address) ?? 0;
    if (fromAddress >= this.limits.perAddress) {
      this.refuse(socket, 'its address holds its share (HANGAR_MAX_CONNECTIONS_PER_ADDRESS)', address);
      return;
    }
    this.makeRoom();
    if (this.held.size >= this.limits.total) {
      this.refuse(socket, 'HANGAR_MAX_CONNECTIONS reached', address);
      return;
    }
    this.held.set(socket, address);
    this.byAddress.set(address, fromAddress + 1);
    socket.once('close', () => this.release(socket));
    this.pending.set(socket, Date.now());
  }

  /** Gives a connection's slot back, once: when it closes, or at once when it is closed to make room. */
  private release(socket: Socket): void {
    const address = this.held.get(socket);
    if (address === undefined) return;
    this.held.delete(socket);
    this.pending.delete(socket);
    const left = (this.byAddress.get(address) ?? 1) - 1;
    if (left > 0) this.byAddress.set(address, left);
    else this.byAddress.delete(address);
  }

  /**
   * Past the pending budget, or with every slot taken, the connections that have waited longest for their
   * headers (past PENDING_GRACE_MS) are closed: the likeliest tricklers, or kept-alive connections idle the
   * longest, which their clients reopen at no cost. Slots held by requests that arrived are never taken.
   */
  private makeRoom(): void {
    const now = Date.now();
    for (const [oldest, since] of this.pending) {
      const full = this.pending.size >= this.limits.pending || this.held.size >= this.limits.total;
      if (!full || now - since < PENDING_GRACE_MS) return;
      this.warn('closed the connection that waited longest for its headers, to make room', {
        remote: this.held.get(oldest),
        pending: this.limits.pending,
      });
      // Its slot is free now, not when its close event comes: the new connection takes it in this same tick.
      this.release(oldest);
      oldest.destroy();
    }
  }

  private refuse(socket: Socket, why: string, address: string): void {
    this.warn(`closed a connection as it arrived: ${why}`, { remote: address, ...this.limits });
    socket.destroy();
  }

  private requestArrived(req: http.IncomingMessage, res: http.ServerResponse): void {
    const socket = req.socket;
    this.pending.delete(socket);
    // Kept alive after its answer, the connection waits for the next request's headers again.
    res.once('finish', () => {
      if (!socket.destroyed && res.shouldKeepAlive && this.held.has(socket)) this.pending.set(socket, Date.now());
    });
  }

  /** Once a minute at most: under an attack this would be a line per connection. */
  private warn(message: string, data: Record<string, unknown>): void {
    if (Date.now() - this.lastWarned < 60_000) return;
    this.lastWarned = Date.now();
    this.log.warn(message, data);
  }
}

// The socket's peer, never X-Forwarded-For: the share is taken before any header has arrived. An IPv6 peer counts
// by its /64: a single host is handed a whole /64 and may pick a fresh address in it for every connection.
export function addressOf(socket: Pick<Socket, 'remoteAddress'>): string {
  const address = clientAddress(socket.remoteAddress, undefined, false) ?? 'unknown';
  return address.includes(':') ? `${ipv6Groups(address).slice(0, 4).join(':')}::/64` : address;
}

/** The eight groups of an IPv6 address, '::' expanded ("2001:db8::1" → 2001, db8, 0, 0, 0, 0, 0, 1). */
function ipv6Groups(address: string): string[] {
  const [head = '', tail] = address.split('::');
  const left = head ? head.split(':') : [];
  const right = tail ? tail.split(':') : [];
  const zeros = tail === undefined ? [] : Array(Math.max(0, 8 - left.length - right.length)).fill('0');
  return [...left, ...zeros, ...right].map((g) => g.toLowerCase().replace(/^0+(?=.)/, ''));
}
