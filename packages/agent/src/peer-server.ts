import fs from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '@hangar/common/log';
import { checkPeerTicket } from '@hangar/common/peer-ticket';
import { sleep } from '@hangar/common/retry';
import type { Growing, ModelCache } from './model-cache.js';

// This node's model files for other nodes (weights node to node): GET /peer/files/<sha256>, one Range, the
// control plane's ticket as the bearer token, checked here with this node's key and no call out. A file is
// served whole and verified from the cache, or, while this node is still fetching it, as its bytes arrive: the
// answer promises the whole file's length and sends each byte once it is on this disk, so a node one step
// behind streams from this one instead of from the mirror. The asker checks the sha256 either way: these bytes
// are served as the file's, not vouched for.

export type PeerServerOptions = {
  cache: ModelCache;
  log: Logger;
  /** This node's id and key, once the control plane has given them (reportNodeFiles); null until then. */
  identity: () => { nodeId: string; key: string } | null;
  /** How long a request for a file this node is about to fetch waits for its first byte to be on the way. */
  appearMs?: number;
  /** With no new byte for this long, a file still arriving is cut off: the asker goes elsewhere. */
  stallMs?: number;
  /** A rate every byte sent takes from (HANGAR_AGENT_TRANSFER_RATE: this node's uplink, in tests and benchmarks). */
  throttle?: { slice(): number; take(bytes: number): Promise<void> };
};

export type PeerServer = {
  /** Binds; resolves to the origin other nodes reach it at from this machine (http://host:port). */
  listen(at: { host: string; port: number }): Promise<string>;
  /** Bytes sent to other nodes since start. */
  readonly sentBytes: number;
  close(): Promise<void>;
};

const FILE = /^\/peer\/files\/([0-9a-f]{64})$/;
const BLOCK = 1 << 20;

export function createPeerServer(o: PeerServerOptions): PeerServer {
  const sockets = new Set<import('node:net').Socket>();
  let sent = 0;
  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      o.log.warn('serving a model file to another node failed', { error: (err as Error).message });
      if (!res.headersSent) res.writeHead(500).end();
      else res.destroy();
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });

  const refuse = (res: ServerResponse, status: number, why: string) => {
    res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8' }).end(`${why}\n`);
  };

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const m = (req.url ?? '').split('?')[0]?.match(FILE);
    if (!m) return refuse(res, 404, 'not a file of this node: GET /peer/files/<sha256>');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    const sha256 = m[1] as string;
    const me = o.identity();
    if (!me) return refuse(res, 503, 'this node has no key from the control plane yet: ask again shortly');
    const ticket = req.headers.authorization?.match(/^Bearer (\S+)$/)?.[1];
    if (!ticket) return refuse(res, 401, "a ticket from the control plane's peerSources is needed as the bearer token");
    const checked = checkPeerTicket(me.key, ticket, { sha256, server: me.nodeId, nowMs: Date.now() });
    if (!checked.ok) return refuse(res, 403, checked.reason);

    const whole = await o.cache.heldFile(sha256);
    const growing = whole ? undefined : await appearing(sha256);
    if (!whole && !growing) return refuse(res, 404, 'this node neither holds nor fetches that file');
    const size = whole ? whole.bytes : (growing as Growing).total;
    const range = parseRange(req.headers.range, size);
    if (range === 'unsatisfiable') {
      res.writeHead(416, { 'content-range': `bytes */${size}` }).end();
      return;
    }
    const { start, end } = range ?? { start: 0, end: size - 1 };
    const headers: Record<string, string | number> = {
      'accept-ranges': 'bytes',
      // The sha256 the file must hash to (the control plane's and the mirror's name for it), as the mirror's ETag.
      etag: `"${sha256}"`,
      'content-type': 'application/octet-stream',
      'content-length': size === 0 ? 0 : end - start + 1,
    };
    if (range) headers['content-range'] = `bytes ${start}-${end}/${size}`;
    res.writeHead(range ? 206 : 200, headers);
    if (req.method === 'HEAD' || size === 0) {
      res.end();
      return;
    }
    o.log.debug('sending a model file to another node', { sha256, asker: checked.ticket.asker, start, whole: !!whole });
    // A file that arrived whole between the look and the open has just been renamed into the cache.
    const fh = await fs
      .open(whole ? whole.file : (growing as Growing).partial, 'r')
      .catch(async () => fs.open(o.cache.fileFor(sha256), 'r'));
    try {
      await send(fh, start, end, res, whole ? null : (growing as Growing));
    } finally {
      await fh.close();
    }
  }

  /** The file being fetched here, waiting a moment for a fetch the control plane already counts as started. */
  async function appearing(sha256: string): Promise<Growing | undefined> {
    const until = Date.now() + (o.appearMs ?? 5000);
    for (;;) {
      const g = o.cache.growing(sha256);
      if (g) return g;
      const held = await o.cache.heldFile(sha256);
      if (held || Date.now() >= until) return undefined;
      await sleep(100);
    }
  }

  /** Bytes [start, end] to the socket, with backpressure; from a file still arriving, each once it is written. */
  async function send(fh: fs.FileHandle, start: number, end: number, res: ServerResponse, g: Growing | null) {
    const buf = Buffer.allocUnsafe(BLOCK);
    let quietSince = Date.now();
    for (let at = start; at <= end && !res.destroyed; ) {
      const avail = g ? g.done : end + 1;
      if (g && at >= avail) {
        // The fetch here failed and gave up: what it had is no use to promise further.
        if (g.ended === 'failed') throw new Error('the fetch of this file on this node failed');
        if (Date.now() - quietSince > (o.stallMs ?? 30_000)) throw new Error('no new byte of the file arrived here');
        await g.next(250);
        continue;
      }
      const n = Math.min(o.throttle?.slice() ?? BLOCK, Math.min(end + 1, avail) - at);
      await o.throttle?.take(n);
      const { bytesRead } = await fh.read(buf, 0, n, at);
      if (bytesRead === 0) throw new Error(`the file ended at ${at} bytes while being sent`);
      at += bytesRead;
      sent += bytesRead;
      quietSince = Date.now();
      const copy = Buffer.from(buf.subarray(0, bytesRead));
      if (!res.write(copy))
        await new Promise<void>((r) => {
          const go = () => {
            res.off('drain', go).off('close', go);
            r();
          };
          res.on('drain', go).on('close', go);
        });
    }
    if (!res.destroyed) res.end();
  }

  return {
    get sentBytes() {
      return sent;
    },
    listen(at) {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(at.port, at.host, () => {
          server.off('error', reject);
          const a = server.address() as AddressInfo;
          const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
          resolve(`http://${host}:${a.port}`);
        });
      });
    },
    async close() {
      await new Promise<void>((r) => {
        server.close(() => r());
        for (const s of sockets) s.destroy();
      });
    },
  };
}

/** One `bytes=a-b`, `bytes=a-` or `bytes=-n` range against a size; null to send it all. */
function parseRange(header: string | undefined, size: number): { start: number; end: number } | null | 'unsatisfiable' {
  const m = header?.match(/^\s*bytes\s*=\s*(\d*)-(\d*)\s*$/i);
  if (!m || (m[1] === '' && m[2] === '')) return null;
  if (m[1] === '') {
    const n = Number(m[2]);
    return n === 0 || size === 0 ? 'unsatisfiable' : { start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (start >= size) return 'unsatisfiable';
  return end < start ? null : { start, end };
}

/**
 * The origin other nodes are given for this peer server: where it is bound, or, bound to every interface, the
 * host the agent's endpoint is advertised at (the address the control plane already reaches this node by).
 */
export function peerOrigin(bound: string, advertisedEndpoint: string): string {
  const b = new URL(bound);
  if (b.hostname !== '0.0.0.0' && b.hostname !== '[::]') return b.origin;
  return `http://${new URL(advertisedEndpoint).hostname}:${b.port}`;
}
