import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@hangar/common/log';
import { newPeerKey, signPeerTicket } from '@hangar/common/peer-ticket';
import { bytes, sha256, startUpstream, type Upstream } from '@hangar/common/test/fixtures/fault-upstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ModelCache, type PeerSourcing } from './model-cache.js';
import { createPeerServer, type PeerServer } from './peer-server.js';

// A node's file endpoint for other nodes, over a real socket: only the control plane's ticket for this node and
// this file opens it, Range works, a file still arriving is sent as it arrives; and the fetching side believes
// the mirror's sha256, not a peer. The mirror is the fault-injecting stand-in (Range, the sha256 as ETag).

const log = createLogger('silent');
const body = bytes(2 << 20, 11);
const sha = sha256(body);
const key = newPeerKey();
let dir: string;
let up: Upstream;
let server: PeerServer;
let origin: string;

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'hangar-peer-'));
  up = await startUpstream();
  const cache = new ModelCache(path.join(dir, 'holder'));
  await fs.mkdir(cache.modelsDir, { recursive: true });
  await fs.writeFile(path.join(cache.modelsDir, `${sha}.gguf`), body);
  server = createPeerServer({ cache, log, identity: () => ({ nodeId: 'node-a', key }) });
  origin = await server.listen({ host: '127.0.0.1', port: 0 });
});
afterAll(async () => {
  await server?.close();
  await up?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const ticket = (o: Partial<{ sha256: string; server: string; expiresAt: number; key: string }> = {}) =>
  signPeerTicket(o.key ?? key, {
    sha256: o.sha256 ?? sha,
    asker: 'node-b',
    server: o.server ?? 'node-a',
    expiresAt: o.expiresAt ?? Date.now() + 60_000,
  });
const get = (t: string | null, headers: Record<string, string> = {}, file = sha) =>
  fetch(`${origin}/peer/files/${file}`, { headers: { ...(t ? { authorization: `Bearer ${t}` } : {}), ...headers } });

describe('the peer server', () => {
  it('sends a held file for a ticket bound to it, with Range, and refuses every other ticket', async () => {
    const whole = await get(ticket());
    expect(whole.status).toBe(200);
    expect(whole.headers.get('etag')).toBe(`"${sha}"`);
    expect(sha256(Buffer.from(await whole.arrayBuffer()))).toBe(sha);
    const part = await get(ticket(), { range: 'bytes=1000-' });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 1000-${body.length - 1}/${body.length}`);
    expect(Buffer.from(await part.arrayBuffer()).equals(body.subarray(1000))).toBe(true);

    expect((await get(null)).status).toBe(401);
    const refusals = [
      [ticket({ key: newPeerKey() }), 'not signed for this node'],
      [ticket({ server: 'node-c' }), 'for another node'],
      [ticket({ sha256: 'f'.repeat(64) }), 'for another file'],
      [ticket({ expiresAt: Date.now() - 1000 }), 'expired'],
      [`${ticket()}x`, 'not signed for this node'],
    ] as const;
    for (const [t, why] of refusals) {
      const res = await get(t);
      expect(res.status).toBe(403);
      expect(await res.text()).toContain(why);
    }
    // A ticket for one file opens no other, even one this node holds under another name.
    const other = await get(ticket(), {}, 'e'.repeat(64));
    expect(other.status).toBe(403);
  });

  it('fetches from a peer with Range, resuming from another when one cuts off', async () => {
    up.files.set('model.gguf', { body });
    const mirror = up.url('model.gguf');
    // A peer that cuts off a third of the way in, and a second that holds the file: the node finishes from the
    // second, resuming, and no byte comes from the mirror.
    let cuts = 0;
    const third = Math.floor(body.length / 3);
    const cutting = await standInPeer((req, res) => {
      // Then gone: a peer that died (503 here, as a proxy in front of it would say).
      if (cuts++) return res.writeHead(503).end();
      res.writeHead(200, { 'content-length': body.length, etag: `"${sha}"` });
      res.write(body.subarray(0, third), () => req.socket.destroy());
    });
    const sentBefore = server.sentBytes;
    const asked: string[][] = [];
    const peers: PeerSourcing = {
      sources: async (_sha, _bytes, exclude) => {
        asked.push([...exclude]);
        return exclude.length
          ? { fromMirror: true, sources: [] }
          : {
              fromMirror: false,
              sources: [
                { nodeId: 'cutting', node: 'cutting', url: `${cutting.origin}/peer/files/${sha}`, ticket: 'x' },
                { nodeId: 'node-a', node: 'node-a', url: `${origin}/peer/files/${sha}`, ticket: ticket() },
              ],
            };
      },
    };
    const counts = { mirror: 0, peer: 0 };
    const cache = new ModelCache(path.join(dir, 'asker'), {
      auth: { origin: new URL(mirror).origin, token: 'hgn_test' },
      peers,
      backoffMs: 10,
      stallMs: 2000,
      onBytes: (from, n) => {
        counts[from] += n;
      },
    });
    const got = await cache.fetch(mirror);
    expect(got.sha256).toBe(sha);
    expect(sha256(await fs.readFile(got.file))).toBe(sha);
    expect(counts).toEqual({ mirror: 0, peer: body.length });
    // The second peer was asked only for what the first had not sent; the mirror for nothing but a HEAD.
    expect(server.sentBytes - sentBefore).toBe(body.length - third);
    expect(up.requests.filter((r) => r.name === 'model.gguf').map((r) => r.status)).toEqual([200]);
    await cutting.close();
  });

  it('does not keep what a lying peer sends: the sha256 fails, and the file comes from the mirror', async () => {
    up.files.set('lied.gguf', { body });
    const mirror = up.url('lied.gguf');
    const liar = await standInPeer((_req, res) => {
      // Other bytes of the right length, under the right name: only the hash tells.
      res.writeHead(200, { 'content-length': body.length, etag: `"${sha}"` }).end(bytes(body.length, 99));
    });
    const counts = { mirror: 0, peer: 0 };
    const cache = new ModelCache(path.join(dir, 'lied'), {
      auth: { origin: new URL(mirror).origin, token: 'hgn_test' },
      peers: {
        sources: async (_s, _b, exclude) =>
          exclude.length
            ? { fromMirror: true, sources: [] }
            : { fromMirror: false, sources: [{ nodeId: 'liar', node: 'liar', url: `${liar.origin}/x`, ticket: 't' }] },
      },
      backoffMs: 10,
      stallMs: 2000,
      onBytes: (from, n) => {
        counts[from] += n;
      },
    });
    const got = await cache.fetch(mirror);
    expect(sha256(await fs.readFile(got.file))).toBe(sha);
    expect(counts.mirror).toBe(body.length);
    await liar.close();
  });
});

/** A node's file endpoint that misbehaves as told: stands in for a peer that fails or lies. */
async function standInPeer(handle: http.RequestListener) {
  const s = http.createServer(handle);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return {
    origin: `http://127.0.0.1:${(s.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => s.close(() => r())),
  };
}
