import { newPeerKey, signPeerTicket } from '@hangar/common/peer-ticket';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Actor } from '../auth/actor.js';
import type { Db } from '../db/client.js';
import { ConflictError, fail, ok, type Result } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { onlineAt } from './fleet-placement.js';

// Weights node to node. Each agent reports the model files it holds (verified, whole) and those it is fetching,
// by sha256, with the URL other nodes fetch them from (reportNodeFiles, every heartbeat). A node about to fetch a
// file asks here first (peerSources) and is told which nodes to fetch it from, each with a ticket only that node
// accepts; it falls back to the mirror itself when they all fail.
//
// Coordination, so that nodes starting one model at once do not all pull it from the mirror: the first node to
// ask for a file nobody holds or fetches is told to take it from the mirror, and the asking is serialised per file
// (an advisory lock), so exactly one is. Every later node is sent to the nodes that hold it, then to those still
// fetching it (each list shuffled, to spread them): a fetching node serves the bytes it has and the rest as they arrive,
// so the followers run a step behind the one mirror download rather than waiting for its end. A node that
// cannot be reached is named in `exclude` when its asker asks again; a node whose reports stopped (15 s) or that
// is offline is never offered, and a designated node that died mid-fetch loses its claim the same way.

/** A report older than this is not believed: the agent reports every heartbeat (5 s by default). */
export const PEER_FRESH_MS = 15_000;
/** A ticket authorises requests begun within this; a download that resumes later asks for a new one. */
export const PEER_TICKET_MS = 60_000;
/** Nodes offered per answer: enough to fall back twice, few enough that one bad answer costs little. */
const MAX_SOURCES = 4;
const LOCK = 0x70656572; // 'peer'
/**
 * Eight nodes asking for one file at once wait on its lock in turn: on a busy database Prisma's 5 s default would
 * fail the later askers, and a node not told falls back to the mirror, the very thing the lock is there to spare.
 */
const TX = { maxWait: 10_000, timeout: 30_000 };

const sha256 = z.string().regex(/^[0-9a-f]{64}$/, 'a sha256 as 64 lowercase hex digits');
const file = z.object({ sha256, bytes: z.number().int().min(0) });

const reportInput = z.object({
  url: z
    .string()
    .max(500, 'at most 500 characters')
    .refine((u) => /^https?:\/\/[^/?#@]+\/?$/.test(u), 'an http:// origin such as http://10.0.0.5:8091, no path')
    .nullish(),
  held: z.array(file).max(10_000, 'at most 10000 files'),
  fetching: z.array(file).max(1000, 'at most 1000 files'),
  mirrorBytes: z.number().int().min(0),
  peerBytes: z.number().int().min(0),
});

const sourcesInput = z.object({
  sha256,
  bytes: z.number().int().min(0),
  exclude: z.array(z.string().uuid('a node id, as peerSources gave it')).max(100).nullish(),
});

export type PeerSource = { nodeId: string; node: string; url: string; ticket: string; held: boolean };
export type PeerPlan = { you: string; fromMirror: boolean; sources: PeerSource[] };

export type PeerServiceDeps = { db: Db; audit: AuditService };

export class PeerService {
  private readonly db: Db;
  private readonly audit: AuditService;

  constructor({ db, audit }: PeerServiceDeps) {
    this.db = db;
    this.audit = audit;
  }

  /**
   * What an agent holds and fetches now (replacing what it said before), its file URL and its byte counts.
   * Answers with the node's key, for checking the tickets other nodes bring it; made on the first report.
   */
  async report(actor: Actor, input: unknown): Promise<Result<{ nodeId: string; peerKey: string }>> {
    if (actor.viewer.kind !== 'node')
      return fail(new ConflictError('reportNodeFiles is for node agents, with their node token'));
    const parsed = parseInput(reportInput, input);
    if (!parsed.ok) return parsed;
    const r = parsed.value;
    const node = actor.viewer.node;
    const now = this.db.clock.now();
    const url = r.url ? r.url.replace(/\/+$/, '') : null;
    const files = new Map<string, { bytes: number; held: boolean }>();
    for (const f of r.fetching) files.set(f.sha256, { bytes: f.bytes, held: false });
    for (const f of r.held) files.set(f.sha256, { bytes: f.bytes, held: true });
    const peer = await this.db.$transaction(async (tx) => {
      const before = await tx.nodePeer.findUnique({ where: { nodeId: node.id } });
      const p = await tx.nodePeer.upsert({
        where: { nodeId: node.id },
        create: {
          nodeId: node.id,
          url,
          key: newPeerKey(),
          mirrorBytes: BigInt(r.mirrorBytes),
          peerBytes: BigInt(r.peerBytes),
          reportedAt: now,
        },
        update: { url, mirrorBytes: BigInt(r.mirrorBytes), peerBytes: BigInt(r.peerBytes), reportedAt: now },
      });
      await tx.nodeFile.deleteMany({ where: { nodeId: node.id, sha256: { notIn: [...files.keys()] } } });
      for (const [sha, f] of files) {
        const where = { nodeId_sha256: { nodeId: node.id, sha256: sha } };
        if (f.held)
          await tx.nodeFile.upsert({
            where,
            create: { nodeId: node.id, sha256: sha, bytes: BigInt(f.bytes), held: true, updatedAt: now },
            update: { bytes: BigInt(f.bytes), held: true, updatedAt: now },
          });
        // A fetch is kept fresh here, never started: its row is made when the node asks (sources), so that the
        // order of the rows is the order of asking, which is what keeps two nodes from waiting on each other.
        else
          await tx.nodeFile.updateMany({
            where: { nodeId: node.id, sha256: sha, held: false },
            data: { updatedAt: now },
          });
      }
      // Said once, not every heartbeat: where other nodes will come for this node's files.
      if ((before?.url ?? null) !== url)
        await this.audit.done(tx, actor, {
          action: 'reportNodeFiles',
          target: node.name,
          message: url ? `serves its model files to other nodes at ${url}` : 'serves no model files to other nodes',
        });
      return p;
    }, TX);
    return ok({ nodeId: node.id, peerKey: peer.key });
  }

  /**
   * Where the calling node should fetch a file from: the nodes holding it, then those fetching it, each with a
   * ticket; or, when there are none, the mirror, and the caller is the one node that fetches it from there.
   */
  async sources(actor: Actor, input: unknown): Promise<Result<PeerPlan>> {
    if (actor.viewer.kind !== 'node')
      return fail(new ConflictError('peerSources is for node agents, with their node token'));
    const parsed = parseInput(sourcesInput, input);
    if (!parsed.ok) return parsed;
    const { sha256: sha, bytes } = parsed.value;
    const exclude = new Set(parsed.value.exclude ?? []);
    const me = actor.viewer.node;
    return ok(
      await this.db.$transaction(async (tx) => {
        // One asker at a time per file: two nodes asking at once must not both be told to take the mirror.
        await tx.$executeRaw`SELECT pg_advisory_xact_lock(${LOCK}, hashtext(${sha}))`;
        const nowMs = this.db.clock.nowMs();
        const fresh = new Date(nowMs - PEER_FRESH_MS);
        const mine = await tx.nodeFile.findUnique({ where: { nodeId_sha256: { nodeId: me.id, sha256: sha } } });
        const since = mine?.since ?? new Date(nowMs);
        const rows = await tx.nodeFile.findMany({
          where: { sha256: sha, nodeId: { not: me.id }, updatedAt: { gte: fresh } },
          include: { node: { include: { peer: true } } },
          orderBy: { updatedAt: 'asc' },
        });
        const usable = rows.filter(
          (r) =>
            !exclude.has(r.nodeId) &&
            r.node.peer?.url &&
            r.node.peer.reportedAt >= fresh &&
            onlineAt(r.node, nowMs) &&
            r.bytes === BigInt(bytes),
        );
        // Those holding it whole first, then those still fetching it, each in a shuffled order: many askers spread
        // over them (a tree of nodes each serving a few) rather than all taking the first one's uplink.
        const held = shuffle(usable.filter((r) => r.held));
        // Only nodes that began before this one: one sent to a later node could end up its source too, and the
        // two would wait on each other's bytes until both stalled.
        const fetching = shuffle(usable.filter((r) => !r.held && r.since < since));
        const chosen = [...held, ...fetching].slice(0, MAX_SOURCES);
        const expiresAt = nowMs + PEER_TICKET_MS;
        const sources = chosen.map((r) => ({
          nodeId: r.nodeId,
          node: r.node.name,
          url: `${r.node.peer?.url}/peer/files/${sha}`,
          ticket: signPeerTicket(r.node.peer?.key ?? '', { sha256: sha, asker: me.id, server: r.nodeId, expiresAt }),
          held: r.held,
        }));
        // The asker fetches it from now on (from a peer or the mirror), so later askers may take its bytes too;
        // a file it holds already is not set back to fetching.
        await tx.nodeFile.upsert({
          where: { nodeId_sha256: { nodeId: me.id, sha256: sha } },
          create: { nodeId: me.id, sha256: sha, bytes: BigInt(bytes), held: false, since, updatedAt: new Date(nowMs) },
          update: { updatedAt: new Date(nowMs) },
        });
        if (!sources.length)
          await this.audit.done(tx, actor, {
            action: 'peerSources',
            target: me.name,
            message: `fetches ${sha.slice(0, 12)}… (${bytes} bytes) from the mirror: no other node holds or fetches it${exclude.size ? ` that it can reach (${exclude.size} could not be)` : ''}`,
          });
        return { you: me.id, fromMirror: sources.length === 0, sources };
      }, TX),
    );
  }

  /** Each node's reported download bytes by source, for /metrics. */
  async downloadTotals(): Promise<{ node: string; mirrorBytes: number; peerBytes: number }[]> {
    const rows = await this.db.nodePeer.findMany({ include: { node: { select: { name: true } } } });
    return rows.map((r) => ({ node: r.node.name, mirrorBytes: Number(r.mirrorBytes), peerBytes: Number(r.peerBytes) }));
  }
}

function shuffle<T>(a: T[]): T[] {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j] as T, a[i] as T];
  }
  return a;
}
