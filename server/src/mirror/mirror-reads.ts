import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import type { Logger } from '@hangar/common/log';
import { OutboundPolicy } from '@hangar/common/outbound';
import type { AuditService } from '../audit/audit.service.js';
import type { Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import type { MirrorFile } from '../generated/prisma/client.js';
import { Bandwidth, SLICE } from './bandwidth.js';
import { readFileKind } from './kind.js';
import {
  ACTIVE,
  type LookBeforeFetch,
  type MirrorVersionView,
  mirrorVersionsIn,
  sourceKey,
  type VersionUse,
  view,
} from './mirror-view.js';
import { MirrorPaths } from './paths.js';
import { compareVersions, modelFamily, versionProgress } from './progress.js';

// The mirror's state (one per server process) and what reads it: versions, families, free space, who uses what.
// The mirror service is one class written in four files, one concern each, every layer on top of this one:
// mirror-reads.ts → mirror-landing.ts (bytes arriving: uploads, a transfer's end) → mirror-worker.ts (the
// queue: claims, leases, transfers) → mirror.service.ts (what the operator asks: fetch, cancel, remove…).

/** Past this many rows changed since the last listing, it reads every row rather than name them one by one. */
const CHANGED_READ_MAX = 500;

export class MirrorReads {
  readonly paths: MirrorPaths;
  /**
   * Lets the server's own checks (the HEAD before a model is served) through when HANGAR_MIRROR_REQUIRE_TOKEN is
   * set. Random per process and never stored or shown.
   */
  readonly internalToken = `hgi_${randomUUID()}${randomUUID()}`;
  protected readonly owner = `${process.pid}-${randomUUID().slice(0, 8)}`;
  /** This replica's mirror storage (storage.ts), known once openStorage() has accepted it. */
  storageId: string | null = null;
  protected readonly transfers = new Map<string, AbortController>();
  /** What each of this process's running downloads still needs of the disk, by file id (reserveSpace). */
  protected readonly reserved = new Map<string, number>();
  /** Which hosts and addresses the server fetches from (HANGAR_FETCH_ALLOW). */
  readonly outbound: OutboundPolicy;
  /** HANGAR_MIRROR_BANDWIDTH, shared by every download of this process. */
  readonly limit: Bandwidth;
  protected readonly bandwidth: { slice(): number | null; take(n: number, signal?: AbortSignal): Promise<void> };
  /** Free bytes on the mirror's filesystem; replaced in tests that need a disk of a given size. */
  diskFree: () => Promise<number> = async () => {
    await fs.mkdir(this.paths.root, { recursive: true });
    const stats = await fs.statfs(this.paths.root);
    return stats.bavail * stats.bsize;
  };
  protected poll: NodeJS.Timeout | undefined;
  protected running = false;
  protected stopping = false;
  protected ticking = false;
  protected baseUrl: () => string = () => 'http://127.0.0.1';
  /** Reads GGUF headers before a fetch (set by the app: it needs the fleet's llama.cpp build); none, nothing is read. */
  protected lookAt: LookBeforeFetch | null = null;
  /**
   * Who may read what an owner owns (OrgService.mayRead), set by the app: a copy of an owned file's bytes is
   * reused for a requester only when it answers yes. None, and owned bytes are never reused.
   */
  protected owners: { mayRead(viewer: Viewer, owner: string | null): Promise<boolean> } | null = null;
  /** The workers' view of the database: paused (not failed) while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(
    protected readonly db: Db,
    protected readonly audit: AuditService,
    protected readonly config: Config,
    protected readonly log: Logger,
  ) {
    this.paths = new MirrorPaths(config.dataDir);
    this.health = new LoopHealth('mirror downloads', log);
    this.outbound = new OutboundPolicy({ allow: config.fetchAllow, hubUrl: config.hubUrl });
    const limit = new Bandwidth(config.mirrorBandwidth);
    this.limit = limit;
    this.bandwidth = {
      slice: () => (limit.limit === null ? null : SLICE),
      take: (n, signal) => limit.take(n, signal),
    };
  }

  /** Where nodes and catalog entries fetch from: HANGAR_PUBLIC_URL, or the address the server listens on. */
  setBaseUrl(get: () => string) {
    this.baseUrl = get;
  }
  lookBeforeFetch(look: LookBeforeFetch) {
    this.lookAt = look;
  }
  readOwnersWith(owners: NonNullable<MirrorReads['owners']>) {
    this.owners = owners;
  }
  /**
   * Whether a URL is on the Hub's origin (HANGAR_HUB_URL): only what was fetched from there is a Hub repository's
   * file (for /hf, and for training's base weights), so those bytes must be ones the Hub answered for, never only
   * a digest someone claimed, nor another server's answer to a path shaped like the Hub's.
   */
  isHubUrl(url: string): boolean {
    if (!this.config.hubUrl) return false;
    try {
      return new URL(url).origin === new URL(this.config.hubUrl).origin;
    } catch {
      return false;
    }
  }
  base() {
    return `${this.config.publicUrl ?? this.baseUrl()}/mirror`;
  }
  versionUrl(model: string, version: string) {
    return `${this.base()}/${encodeURIComponent(model)}/${encodeURIComponent(version)}/`;
  }
  fileUrl(f: Pick<MirrorFile, 'model' | 'version' | 'file'>) {
    return this.versionUrl(f.model, f.version) + f.file.split('/').map(encodeURIComponent).join('/');
  }

  // ─── reading ───────────────────────────────────────────────────────────────

  /**
   * Every file row as the last listing read it, with the row's version then (PostgreSQL's xmin: a new one with
   * every change of the row, by any replica, by any statement). At 5000 versions the full read is 100–180 ms of
   * the Mirror page's query; the versions alone are a tenth of that, and then only the rows that changed are read.
   * Nothing here trusts an event: a row whose xmin is the same is the row as it is.
   */
  private listed = new Map<string, { xmin: string; row: MirrorFile }>();
  /** The versions built from `listed`, handed out again while no row has changed. */
  private listing: MirrorVersionView[] | undefined;

  async versions(): Promise<MirrorVersionView[]> {
    // In the listing's order (the database's collation, as before), so rows kept and rows read mix in place.
    const now = await this.db.$queryRaw<{ id: string; xmin: string }[]>`
      SELECT id, xmin::text AS xmin FROM "MirrorFile" ORDER BY model, version, file`;
    const changed = now.filter((s) => this.listed.get(s.id)?.xmin !== s.xmin).map((s) => s.id);
    if (!changed.length && now.length === this.listed.size && this.listing) return this.listing;
    // Many changed (the first listing, a burst of new files): all of them in one read, not thousands of ids.
    const rows =
      changed.length === 0
        ? []
        : changed.length > CHANGED_READ_MAX
          ? await this.db.mirrorFile.findMany()
          : await this.db.mirrorFile.findMany({ where: { id: { in: changed } } });
    const fresh = new Map(rows.map((r) => [r.id, r] as const));
    // A row changed after its xmin was read is kept under the older xmin: the next listing reads it again.
    const listed = new Map<string, { xmin: string; row: MirrorFile }>();
    const inOrder: MirrorFile[] = [];
    for (const { id, xmin } of now) {
      const row = fresh.get(id) ?? this.listed.get(id)?.row;
      if (!row) continue; // removed between the two reads
      listed.set(id, { xmin, row });
      inOrder.push(row);
    }
    this.listed = listed;
    const byVersion = new Map<string, MirrorFile[]>();
    for (const r of inOrder) {
      const key = `${r.model}\u0000${r.version}`;
      const list = byVersion.get(key) ?? [];
      list.push(r);
      byVersion.set(key, list);
    }
    this.listing = [...byVersion.values()].map((files) => view(files)).sort(compareVersions);
    return this.listing;
  }

  async version(model: string, version: string): Promise<MirrorVersionView | null> {
    const files = await this.db.mirrorFile.findMany({ where: { model, version }, orderBy: { file: 'asc' } });
    return files.length ? view(files) : null;
  }

  /** What a subscriber is sent: the version as it is now, or its tombstone once removed. */
  async versionOrRemoved(model: string, version: string): Promise<MirrorVersionView> {
    return (
      (await this.version(model, version)) ?? {
        model,
        version,
        files: [],
        state: 'CANCELLED',
        progress: versionProgress([]),
        removed: true,
      }
    );
  }

  families(versions: MirrorVersionView[]) {
    const out: { name: string; versions: MirrorVersionView[] }[] = [];
    const slotOf = new Map<string, number>();
    for (const v of versions) {
      const name = modelFamily(v.model);
      let i = slotOf.get(name);
      if (i === undefined) {
        i = out.push({ name, versions: [] }) - 1;
        slotOf.set(name, i);
      }
      out[i]?.versions.push(v);
    }
    return out;
  }

  /**
   * Free space where the mirror keeps its files, less what the downloads under way (on any replica) and those
   * queued with a known size still need: the room a new fetch really has. (What it uses is the sum of its
   * versions' bytes.)
   */
  async freeBytes() {
    const [free, promised] = await Promise.all([this.diskFree(), this.stillNeeded()]);
    let here = 0;
    for (const n of this.reserved.values()) here += n;
    return Math.max(0, free - promised - here);
  }

  /**
   * Bytes the unfinished files of the given states still need, from their recorded sizes and progress; not
   * those this process has reserved room for, which it knows better (the database hears of progress once a
   * second, and of a size only once the upstream has said it).
   */
  protected async stillNeeded(filter: { states?: readonly string[]; notOwner?: string } = {}, db: Db = this.db) {
    const states = [...(filter.states ?? ACTIVE)];
    const reservedHere = [...this.reserved.keys()];
    const rows = await db.$queryRaw<{ n: bigint | null }[]>`
      SELECT sum(greatest("bytesTotal" - "bytesDone", 0))::bigint AS n FROM "MirrorFile"
      WHERE state::text = ANY(${states}::text[]) AND "bytesTotal" IS NOT NULL
        AND NOT (id = ANY(${reservedHere}::uuid[]))
        AND (${filter.notOwner ?? null}::text IS NULL OR "leaseOwner" IS DISTINCT FROM ${filter.notOwner ?? null}::text)`;
    return Number(rows[0]?.n ?? 0n);
  }

  /**
   * Room for a running download's `bytes` still to come: the disk's free space less what the other running
   * downloads still need (this process's from memory, so two that ask at once cannot both count the same free
   * bytes; other replicas' from the database). Reserved when it fits; otherwise the reason, before a byte of it
   * is written: three 120 MB files on 200 MB free would otherwise all start and all fail at 68 MB.
   */
  protected async reserveSpace(id: string, file: string, bytes: number): Promise<string | null> {
    const [free, elsewhere] = await Promise.all([
      this.diskFree(),
      // A running download's question, on the loops' connections (db.loops) as the download is.
      this.stillNeeded({ states: ['FETCHING', 'VERIFYING'], notOwner: this.owner }, this.db.loops),
    ]);
    // From here to the reservation nothing awaits: this is the one moment the check and the claim are made.
    let here = 0;
    for (const [other, n] of this.reserved) if (other !== id) here += n;
    const room = free - here - elsewhere;
    if (bytes > room) {
      const promised = here + elsewhere;
      return (
        `not enough disk: ${file} has ${bytes} bytes still to come and ${Math.max(0, room)} are free under ` +
        `${this.paths.root}` +
        (promised ? ` once the ${promised} bytes that other running downloads still need are set aside` : '') +
        '; free space (or let the others finish) and retry: the partial is kept'
      );
    }
    this.reserved.set(id, bytes);
    return null;
  }

  /**
   * The version with what each of its files holds: a file verified before kinds were recorded is read from its
   * header now, once, and the answer kept on its row (one that cannot be read stays unknown, to try again).
   */
  async withKinds(mirrored: MirrorVersionView): Promise<MirrorVersionView> {
    if (!mirrored.files.some((f) => f.state === 'PRESENT' && f.kind === null)) return mirrored;
    const files = await Promise.all(
      mirrored.files.map(async (f) => {
        if (f.state !== 'PRESENT' || f.kind !== null) return f;
        const what = await readFileKind(this.paths.file(f.model, f.version, f.file), f.file);
        if (what.kind !== null)
          await this.db.mirrorFile.updateMany({ where: { id: f.id, state: 'PRESENT', kind: null }, data: what });
        return { ...f, ...what };
      }),
    );
    return { ...mirrored, files };
  }

  /** Catalog models and adapters whose source is in this version: what would fail to load without it. */
  async usedBy(model: string, version: string): Promise<VersionUse[]> {
    return (await this.usesByVersion()).get(sourceKey(model, version)) ?? [];
  }

  /**
   * Every catalog model and adapter whose source is in the mirror, by the version it points into (its
   * sourceKey): one query, however many versions a listing shows, where asking each version took one query per
   * row. One statement rather than two findMany: most of their cost at this size is Prisma's own, per call.
   */
  async usesByVersion(): Promise<Map<string, VersionUse[]>> {
    // An adapter runs on its model's replicas: they are what fail to load it without this version.
    const rows = await this.db.$queryRaw<(VersionUse & { source: string })[]>`
      SELECT * FROM (
        SELECT name, source, "minReplicas", "maxReplicas", declared, NULL::text AS "adapterOf",
               array_remove(ARRAY[owner], NULL) AS owners
          FROM "CatalogModel" WHERE source LIKE '%/mirror/%'
        UNION ALL
        SELECT a.name, a.source, m."minReplicas", m."maxReplicas", false, m.name,
               array_remove(ARRAY[a.owner, m.owner], NULL)
          FROM "Adapter" a JOIN "CatalogModel" m ON m.id = a."modelId" WHERE a.source LIKE '%/mirror/%'
      ) uses ORDER BY "adapterOf" IS NOT NULL, name`;
    const uses = new Map<string, VersionUse[]>();
    for (const { source, ...use } of rows) {
      for (const key of mirrorVersionsIn(source)) {
        const list = uses.get(key) ?? [];
        list.push(use);
        uses.set(key, list);
      }
    }
    return uses;
  }
}
