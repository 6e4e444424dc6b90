import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { OutboundPolicy } from '@hangar/common/outbound';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, describeActor, logFor } from '../auth/actor.js';
import type { Config } from '../config.js';
import type { Db, Tx } from '../db/client.js';
import { LoopHealth } from '../db/outage.js';
import type { MirrorFile } from '../generated/prisma/client.js';
import {
  ConflictError,
  fail,
  NotFoundError,
  ok,
  type Result,
  UnloadableError,
  ValidationError,
} from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { type Sight, sees } from '../org/org-owners.js';
import { notify } from '../pubsub.js';
import { Bandwidth, SLICE } from './bandwidth.js';
import { type BucketHeld, bucketHeld, quotaLeft, quotaWhere } from './bucket-space.js';
import { type MayRead, MirrorLanding } from './mirror-landing.js';
import { MirrorReads } from './mirror-reads.js';
import {
  ACTIVE,
  type FetchStarted,
  fetchInput,
  isHubUrl,
  type LookBeforeFetch,
  type MirrorVersionView,
  NO_RETRY,
  nameInput,
  type VersionUse,
  versionKey,
} from './mirror-view.js';
import { fileLeases, MirrorWorkers } from './mirror-worker.js';
import { discardBucketWrite, removeUnheldBlobs } from './on-bucket.js';
import { versionOwner } from './owned.js';
import { fileFromUrl, fileName, MirrorPaths } from './paths.js';
import { MirrorSpace } from './space.js';
import { MirrorStorage } from './storage.js';
import { LocalCopies } from './store/local-copy.js';
import type { MirrorStore } from './store/store.js';
import { transfer } from './transfer.js';

// The mirror: versions of models fetched once into the server's disk and served to nodes from there. This file
// holds what an operator asks of it (fetch, cancel, retry, pause, resume, bandwidth, remove) and composes the
// parts that do the rest, each given what it needs: the reads (mirror-reads.ts), the disk's room (space.ts), the
// storage's id (storage.ts), the landing of bytes (mirror-landing.ts) and the workers' queue (mirror-worker.ts).

export type { MayRead } from './mirror-landing.js';
export type { FetchStarted, LookBeforeFetch, MirrorVersionView, SourceCheck, VersionUse } from './mirror-view.js';
export { mirrorVersionsIn, sourceKey, versionKey } from './mirror-view.js';

export type MirrorDeps = {
  db: Db;
  audit: AuditService;
  config: Config;
  log: Logger;
  /**
   * Who may read what an owner owns (OrgService.mayRead): a copy of an owned file's bytes is linked for a
   * requester only when it answers yes. Null, and owned bytes are never reused.
   */
  mayRead: MayRead | null;
  /**
   * Reads GGUF headers before a fetch by URL (registry/source-look.ts: it knows the nodes' llama.cpp). Null, and
   * nothing is read before a download.
   */
  lookBeforeFetch: LookBeforeFetch | null;
};

export class MirrorService {
  readonly paths: MirrorPaths;
  /**
   * Lets the server's own checks (the HEAD before a model is served) through when HANGAR_MIRROR_REQUIRE_TOKEN is
   * set. Random per process and never stored or shown.
   */
  readonly internalToken = `hgi_${randomUUID()}${randomUUID()}`;
  /** Which hosts and addresses the server fetches from (HANGAR_FETCH_ALLOW). */
  readonly outbound: OutboundPolicy;
  /** HANGAR_MIRROR_BANDWIDTH, shared by every download of this process. */
  readonly limit: Bandwidth;
  /** The workers' view of the database: paused (not failed) while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;
  /** Free bytes on the mirror's filesystem; replaced in tests that need a disk of a given size. */
  diskFree: () => Promise<number> = async () => {
    // A bucket tells no limit (S3 has none to ask for): the room is what HANGAR_S3_QUOTA leaves of what the mirror
    // holds there (bucket-space.ts); with no quota, no fetch is refused for room.
    if (this.storage.bucket) return (await this.bucketUsage())?.leftBytes ?? Number.MAX_SAFE_INTEGER;
    await fs.mkdir(this.paths.root, { recursive: true });
    const stats = await fs.statfs(this.paths.root);
    return stats.bavail * stats.bsize;
  };

  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly config: Config;
  private readonly log: Logger;
  private readonly lookAt: LookBeforeFetch | null;
  /** This process's name on the leases it holds: its claims, and the files fetch links for a requester. */
  private readonly owner = `${process.pid}-${randomUUID().slice(0, 8)}`;
  /** Aborted by stop(): a transfer cut off then goes back to the queue rather than being failed or cancelled. */
  private readonly shutdown = new AbortController();
  private readonly storage: MirrorStorage;
  private readonly space: MirrorSpace;
  private readonly reads: MirrorReads;
  private readonly landing: MirrorLanding;
  private readonly workers: MirrorWorkers;
  private baseUrl: () => string = () => 'http://127.0.0.1';

  constructor(deps: MirrorDeps) {
    const { db, audit, config, log } = deps;
    this.db = db;
    this.audit = audit;
    this.config = config;
    this.log = log;
    this.lookAt = deps.lookBeforeFetch;
    this.paths = new MirrorPaths(config.dataDir);
    this.health = new LoopHealth('mirror downloads', log);
    this.outbound = new OutboundPolicy({ allow: config.fetchAllow, hubUrl: config.hubUrl });
    const limit = new Bandwidth(config.mirrorBandwidth);
    this.limit = limit;
    const paths = this.paths;
    const owner = this.owner;
    this.storage = new MirrorStorage({
      db,
      paths,
      dataDir: config.dataDir,
      log,
      store: config.mirrorStore,
      forcePathStyle: config.s3ForcePathStyle,
    });
    // Through the field, not its value now: a test that replaces diskFree is heard by every part.
    this.space = new MirrorSpace({
      db,
      paths,
      owner,
      diskFree: () => this.diskFree(),
      quotaWhere: () =>
        this.storage.bucket && config.s3QuotaBytes !== null
          ? quotaWhere(config.s3QuotaBytes, this.storage.bucket.where)
          : null,
    });
    this.reads = new MirrorReads({ db, paths, bucket: () => this.storage.bucket });
    // What the landing and the workers both stand on: one storage, one lease owner, one view of the database's
    // health, one shutdown and one count of the disk's room, or the two would disagree about a file between them.
    const ground = {
      db,
      config,
      log,
      paths,
      storage: this.storage,
      owner,
      health: this.health,
      shutdown: this.shutdown.signal,
      space: this.space,
    };
    this.landing = new MirrorLanding({ ...ground, audit, reads: this.reads, mayRead: deps.mayRead });
    this.workers = new MirrorWorkers({
      ...ground,
      landing: this.landing,
      leases: fileLeases,
      transfer,
      outbound: this.outbound,
      throttle: {
        slice: () => (limit.limit === null ? null : SLICE),
        take: (n, signal) => limit.take(n, signal),
      },
    });
  }

  /** This replica's mirror storage (storage.ts), known once openStorage() has accepted it. */
  get storageId(): string | null {
    return this.storage.id;
  }
  /** The bucket the files are kept in (HANGAR_MIRROR_STORE=s3://…), once openStorage(); null on `file`. */
  get bucket(): MirrorStore | null {
    return this.storage.bucket;
  }
  private copies: LocalCopies | null = null;
  /**
   * Verified local copies of the bucket's blobs, for what must read a file (store/local-copy.ts): under
   * <dataDir>/cache/sha256, this replica's own. Null on `file`, where the mirror's files are files already.
   */
  get localCopies(): LocalCopies | null {
    const bucket = this.storage.bucket;
    if (!bucket) return null;
    this.copies ??= new LocalCopies({ store: bucket, dir: path.join(this.config.dataDir, 'cache', 'sha256') });
    return this.copies;
  }

  /** Where nodes and catalog entries fetch from: HANGAR_PUBLIC_URL, or the address the server listens on. */
  setBaseUrl(get: () => string) {
    this.baseUrl = get;
  }
  /** Whether a URL is on the Hub's origin (HANGAR_HUB_URL): see mirror-view.ts. */
  isHubUrl(url: string): boolean {
    return isHubUrl(this.config.hubUrl, url);
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

  // ─── reading (mirror-reads.ts, space.ts) ──────────────────────────────────

  versions(): Promise<MirrorVersionView[]> {
    return this.reads.versions();
  }
  version(model: string, version: string): Promise<MirrorVersionView | null> {
    return this.reads.version(model, version);
  }
  /** What a subscriber is sent: the version as it is now, or its tombstone once removed. */
  versionOrRemoved(model: string, version: string): Promise<MirrorVersionView> {
    return this.reads.versionOrRemoved(model, version);
  }
  families(versions: MirrorVersionView[]) {
    return this.reads.families(versions);
  }
  withKinds(mirrored: MirrorVersionView): Promise<MirrorVersionView> {
    return this.reads.withKinds(mirrored);
  }
  /** A present file's bytes by offset (a GGUF header), from the data dir or the bucket: see mirror-reads.ts. */
  openBytes(f: Pick<MirrorFile, 'model' | 'version' | 'file' | 'actualSha256'>) {
    return this.reads.openBytes(f);
  }
  /** A small present file (a config.json) as text, from the data dir or the bucket. */
  readText(f: Pick<MirrorFile, 'model' | 'version' | 'file' | 'actualSha256'>) {
    return this.reads.readText(f);
  }
  usedBy(model: string, version: string): Promise<VersionUse[]> {
    return this.reads.usedBy(model, version);
  }
  usesByVersion(): Promise<Map<string, VersionUse[]>> {
    return this.reads.usesByVersion();
  }
  /** The room a new fetch really has: free space less what the downloads under way still need (space.ts). */
  freeBytes(): Promise<number> {
    return this.space.freeBytes();
  }
  /**
   * On a bucket: what the mirror holds there, from PostgreSQL (bucket-space.ts), and the room HANGAR_S3_QUOTA
   * leaves (null: no quota); null on `file`.
   */
  async bucketUsage(): Promise<
    (BucketHeld & { where: string; quotaBytes: number | null; leftBytes: number | null }) | null
  > {
    const bucket = this.storage.bucket;
    const id = this.storage.id;
    if (!bucket || !id) return null;
    const held = await bucketHeld(this.db, id);
    const quotaBytes = this.config.s3QuotaBytes;
    return { ...held, where: bucket.where, quotaBytes, leftBytes: quotaLeft(quotaBytes, held) };
  }

  // ─── running (storage.ts, mirror-worker.ts) ───────────────────────────────

  /** Finds this replica's mirror storage, or refuses to start with MirrorStorageError (storage.ts). */
  async openStorage() {
    await this.storage.open();
  }
  /** Picks up what a previous run left and starts the workers (mirror-worker.ts). */
  start(embedded: boolean) {
    return this.workers.start(embedded);
  }
  async stop() {
    // First: a transfer the workers abort from here on is a shutdown, put back in the queue, not a cancel.
    this.shutdown.abort();
    await this.workers.stop();
    this.storage.bucket?.close();
  }

  /** A file's partial bytes, of no more use (cancelled, removed, refetched with force): on disk or in the bucket. */
  private async dropPartial(id: string) {
    await fs.rm(this.paths.partial(id), { force: true });
    if (this.storage.bucket)
      await discardBucketWrite(this.db, this.storage.bucket, id).catch((err) =>
        this.log.warn("could not discard a download's upload in the bucket", { id, error: err }),
      );
  }

  /** Keeps a file Hangar made (a trained adapter) in the mirror, verified like a fetch (mirror-landing.ts). */
  upload(
    actor: Actor,
    input: Parameters<MirrorLanding['upload']>[1],
    body: AsyncIterable<Uint8Array>,
  ): Promise<Result<MirrorVersionView>> {
    return this.landing.upload(actor, input, body);
  }

  // ─── changing ──────────────────────────────────────────────────────────────

  /**
   * Starts fetching a set of files into one version: one decision for a set of any size. Answered as started,
   * never as added: the bytes are still moving, and "added" would invite pointing the catalog at a partial file.
   */
  async fetch(
    actor: Actor,
    input: z.input<typeof fetchInput>,
    o: {
      /** Written with the rows, in their transaction: what the caller knows of the fetch (the Hub's ref, say). */
      withRows?: (tx: Tx) => Promise<void>;
      /** The operation a refusal is audited as (fetchRepoSet's sets come through here too). */
      action?: string;
    } = {},
  ): Promise<Result<FetchStarted>> {
    const parsed = parseInput(fetchInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version, sources, force, fetchAnyway } = parsed.value;
    const owned = await this.landing.refuseOwnedVersion(actor, o.action ?? 'fetchToMirror', model, version);
    if (owned) return fail(owned);
    const files: { file: string; url: string; sha256: string | null; size: number | null }[] = [];
    const seen = new Set<string>();
    for (const [i, s] of sources.entries()) {
      const file = s.file ?? fileFromUrl(s.url);
      const checked = fileName.safeParse(file ?? '');
      if (!checked.success) {
        return fail(
          new ValidationError(
            `sources.${i}.file`,
            `sources.${i}.file: the URL names no usable file (${checked.error.issues[0]?.message}); give file explicitly`,
          ),
        );
      }
      if (seen.has(checked.data)) {
        return fail(
          new ValidationError(`sources.${i}.file`, `sources.${i}.file: ${checked.data} appears twice in this version`),
        );
      }
      seen.add(checked.data);
      files.push({ file: checked.data, url: s.url, sha256: s.sha256 ?? null, size: s.size ?? null });
    }
    // Refused before anything is recorded, and again at each connection (a name can change its address).
    const verdicts = new Map<string, Promise<string | null>>();
    for (const s of sources) {
      const origin = new URL(s.url).origin;
      if (!verdicts.has(origin)) verdicts.set(origin, this.outbound.check(s.url));
    }
    for (const [i, s] of sources.entries()) {
      const refused = await verdicts.get(new URL(s.url).origin);
      if (refused) return fail(new ValidationError(`sources.${i}.url`, `sources.${i}.url: ${refused}`));
    }

    const existing = new Map(
      (await this.db.mirrorFile.findMany({ where: { model, version } })).map((r) => [r.file, r] as const),
    );
    const toStart = files.filter((f) => {
      const row = existing.get(f.file);
      if (!row) return true;
      if ((ACTIVE as readonly string[]).includes(row.state)) return false;
      return row.state !== 'PRESENT' || Boolean(force);
    });
    const alreadyArriving = files.filter((f) =>
      (ACTIVE as readonly string[]).includes(existing.get(f.file)?.state ?? ''),
    ).length;
    const alreadyPresent = force ? 0 : files.filter((f) => existing.get(f.file)?.state === 'PRESENT').length;

    // Read before anything is downloaded: a file the nodes cannot load is an hour of download and a replica
    // failing on every node. Only what is about to start, and of a split model its first shard (which carries
    // the metadata). A header out of reach is no verdict: the download will meet the same wall and say so.
    const notes: string[] = [];
    if (this.lookAt && !fetchAnyway) {
      const looked = toStart.filter((f) => /\.gguf$/i.test(f.file) && !/-(?!0*1-)\d{5}-of-\d{5}\.gguf$/i.test(f.file));
      const checks = await this.lookAt(looked.map((f) => ({ url: f.url, file: f.file })));
      for (const [n, check] of checks.entries()) {
        const f = looked[n];
        if (!f) continue;
        if (check.refusal) {
          const i = files.indexOf(f);
          return fail(
            new UnloadableError(
              `not fetched: ${f.file}: ${check.refusal}. Its header was read before the download; fetch it anyway with fetchAnyway: true (the console's "Fetch anyway")`,
              `sources.${i}.url`,
              f.file,
              check.refusal,
            ),
          );
        }
        notes.push(`${f.file}: ${check.note}`);
      }
    }

    // Checked before any byte moves: a download that fills the disk at 90 % wastes the hour it took.
    const needed = toStart.reduce((n, f) => n + (f.size ?? 0), 0);
    const freeBytes = await this.space.freeBytes();
    if (needed > freeBytes) {
      return fail(
        new ConflictError(this.space.shortage(`${model}/${version}`, needed, freeBytes, 'fetch fewer files')),
      );
    }

    // Asked for by a sha256 held only in owned versions whose owner admits this requester: linked now, for them.
    // The queue's workers act for no one and link only bytes nobody owns, so this is the one place it can happen.
    // (Never for a Hub URL: the Hub answers for a file /hf lists as its own; see mirror-worker.ts.)
    const pinned = new Map<string, { path: string; size: number }>();
    for (const f of toStart) {
      const copy = f.sha256 && !this.isHubUrl(f.url) ? await this.landing.heldCopy(f.sha256, null, actor.viewer) : null;
      if (copy?.owned) pinned.set(f.file, copy);
    }
    const linking: MirrorFile[] = [];

    const requestedBy = describeActor(actor);
    await this.db.$transaction(async (tx) => {
      for (const f of toStart) {
        const fresh = {
          sourceUrl: f.url,
          state: 'QUEUED' as const,
          bytesDone: 0n,
          bytesTotal: f.size === null ? null : BigInt(f.size),
          expectedSha256: f.sha256,
          actualSha256: null,
          etag: null,
          error: null,
          attempts: 0,
          bytesPerSecond: null,
          leaseOwner: null,
          leaseUntil: null,
          storageId: this.storage.id,
          requestedBy,
          startedAt: null,
          finishedAt: null,
        };
        // Held by this process under a lease, as a claimed file is: no worker takes it up meanwhile.
        const data = pinned.has(f.file)
          ? {
              ...fresh,
              state: 'FETCHING' as const,
              leaseOwner: this.owner,
              leaseUntil: fileLeases.deadline(this.db.loops.clock.now()),
              startedAt: new Date(),
            }
          : fresh;
        const row = existing.get(f.file);
        const saved = row
          ? await tx.mirrorFile.update({ where: { id: row.id }, data })
          : await tx.mirrorFile.create({ data: { model, version, file: f.file, ...data } });
        if (pinned.has(f.file)) linking.push(saved);
      }
      const parts = [`${toStart.length} of ${files.length} files started`];
      if (alreadyArriving) parts.push(`${alreadyArriving} already arriving`);
      if (alreadyPresent) parts.push(`${alreadyPresent} already present`);
      await o.withRows?.(tx);
      await this.audit.done(tx, actor, {
        action: 'fetchToMirror',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: parts.join(', '),
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    // Files being refetched with force lose their old partials: a partial of the old upstream is no use.
    for (const f of toStart) {
      const row = existing.get(f.file);
      if (row) await this.dropPartial(row.id);
    }
    for (const row of linking) {
      const copy = pinned.get(row.file) as { path: string; size: number };
      const sha = row.expectedSha256 as string;
      // A copy removed meanwhile: the row stays under its lease, and a worker fetches it from its URL once it ends.
      // (Pinned, so never 'requeued': the kick below looks for work either way.)
      await this.landing
        .finish(row, { ok: true, held: true, size: copy.size, sha256: sha, upstreamSha256: null, etag: null }, copy)
        .catch((err) =>
          logFor(this.log, actor).warn('could not link a held copy; the file is fetched instead', {
            id: row.id,
            error: err,
          }),
        );
    }
    this.workers.kick();
    const view = (await this.reads.version(model, version)) as MirrorVersionView;
    const message =
      toStart.length === 0
        ? alreadyArriving
          ? `nothing new to start: ${alreadyArriving} file(s) already arriving`
          : 'nothing to fetch: every file is already present (force fetches them again)'
        : `started fetching ${toStart.length} file${toStart.length === 1 ? '' : 's'} into ${model}/${version}${notes.length ? ` (${notes.join('; ')})` : ''}`;
    return ok({ version: view, started: toStart.length, alreadyArriving, alreadyPresent, message });
  }

  async cancel(actor: Actor, input: z.input<typeof nameInput>): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    const cancellable = [...ACTIVE, 'PAUSED' as const];
    const rows = await this.db.mirrorFile.findMany({ where: { model, version, state: { in: cancellable } } });
    if (!(await this.reads.version(model, version)))
      return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    if (rows.length === 0) return fail(new ConflictError(`${model}/${version} is not arriving: nothing to cancel`));
    await this.db.$transaction(async (tx) => {
      await tx.mirrorFile.updateMany({
        where: { id: { in: rows.map((r) => r.id) }, state: { in: cancellable } },
        data: {
          state: 'CANCELLED',
          error: 'cancelled',
          leaseOwner: null,
          leaseUntil: null,
          bytesPerSecond: null,
          bytesDone: 0,
        },
      });
      await this.audit.done(tx, actor, {
        action: 'cancelMirrorFetch',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: `${rows.length} file(s) cancelled`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    for (const r of rows) {
      this.workers.abort(r.id);
      await this.dropPartial(r.id);
    }
    return ok((await this.reads.version(model, version)) as MirrorVersionView);
  }

  async retry(actor: Actor, input: z.input<typeof nameInput>): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    const rows = await this.db.mirrorFile.findMany({
      where: { model, version, state: { in: ['FAILED', 'CANCELLED'] } },
    });
    if (!(await this.reads.version(model, version)))
      return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    if (rows.length === 0)
      return fail(new ConflictError(`${model}/${version} has no failed or cancelled file to retry`));
    await this.db.$transaction(async (tx) => {
      for (const r of rows) {
        // A partial kept from before (a full disk, a run of errors) is picked up where it stopped.
        const kept = await fs.stat(this.paths.partial(r.id)).then(
          (s) => s.size,
          () => 0,
        );
        await tx.mirrorFile.update({
          where: { id: r.id },
          data: {
            state: 'QUEUED',
            error: null,
            attempts: 0,
            bytesDone: BigInt(kept),
            leaseOwner: null,
            leaseUntil: null,
            storageId: this.storage.id,
            finishedAt: null,
          },
        });
      }
      await this.audit.done(tx, actor, {
        action: 'retryMirrorFetch',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: `${rows.length} file(s) queued again`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    this.workers.kick();
    return ok((await this.reads.version(model, version)) as MirrorVersionView);
  }

  /**
   * Stops a version's downloads and keeps what they have: its files are never leased while paused, and resume
   * continues each with a Range request from where its partial ends. A file being verified finishes.
   */
  async pause(actor: Actor, input: z.input<typeof nameInput>): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    if (!(await this.reads.version(model, version)))
      return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    const rows = await this.db.mirrorFile.findMany({
      where: { model, version, state: { in: ['QUEUED', 'FETCHING'] } },
    });
    if (rows.length === 0)
      return fail(new ConflictError(`${model}/${version} is not downloading: nothing to pause (resume a paused one)`));
    await this.db.$transaction(async (tx) => {
      await tx.mirrorFile.updateMany({
        where: { id: { in: rows.map((r) => r.id) }, state: { in: ['QUEUED', 'FETCHING'] } },
        data: { state: 'PAUSED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null, ...NO_RETRY },
      });
      await this.audit.done(tx, actor, {
        action: 'pauseMirrorFetch',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: `${rows.length} file(s) paused; their partials are kept`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    // This replica's transfers stop now; another replica's stop at their next progress write (the row is no
    // longer theirs), and keep the partial either way (finish).
    for (const r of rows) this.workers.abort(r.id);
    return ok((await this.reads.version(model, version)) as MirrorVersionView);
  }

  async resume(actor: Actor, input: z.input<typeof nameInput>): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    if (!(await this.reads.version(model, version)))
      return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    const rows = await this.db.mirrorFile.findMany({ where: { model, version, state: 'PAUSED' } });
    if (rows.length === 0) return fail(new ConflictError(`${model}/${version} is not paused: nothing to resume`));
    await this.db.$transaction(async (tx) => {
      for (const r of rows) {
        const kept = await fs.stat(this.paths.partial(r.id)).then(
          (st) => st.size,
          () => 0,
        );
        await tx.mirrorFile.updateMany({
          where: { id: r.id, state: 'PAUSED' },
          data: { state: 'QUEUED', attempts: 0, bytesDone: BigInt(kept), storageId: this.storage.id },
        });
      }
      await this.audit.done(tx, actor, {
        action: 'resumeMirrorFetch',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: `${rows.length} file(s) queued again, each from its partial`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    this.workers.kick();
    return ok((await this.reads.version(model, version)) as MirrorVersionView);
  }

  /**
   * Changes the bandwidth limit every download of this server process shares, at once (the next bytes taken).
   * Not stored: a restart goes back to HANGAR_MIRROR_BANDWIDTH, which is where a lasting limit belongs.
   */
  async setBandwidth(
    actor: Actor,
    input: z.input<typeof bandwidthInput>,
  ): Promise<Result<{ bytesPerSecond: number | null }>> {
    const parsed = parseInput(bandwidthInput, input, '');
    if (!parsed.ok) return parsed;
    const limit = parsed.value.bytesPerSecond ? parsed.value.bytesPerSecond : null;
    await this.db.$transaction(async (tx) => {
      await this.audit.done(tx, actor, {
        action: 'setMirrorBandwidth',
        target: 'mirror',
        message:
          (limit === null ? 'no limit' : `limited to ${limit} bytes per second`) +
          ' for this server process until it restarts (was ' +
          (this.limit.limit === null ? 'no limit' : `${this.limit.limit}`) +
          ')',
      });
    });
    this.limit.setLimit(limit);
    return ok({ bytesPerSecond: limit });
  }

  /**
   * `sight`: the caller's (org-owners.ts `sees`). A use by a model or adapter it may not see is neither named nor
   * counted, and does not hold the removal back: a refusal, even one naming nothing, would confirm to an outsider
   * that a team's model is served from this version. The owner is told instead, in a row of its own.
   */
  async remove(
    actor: Actor,
    input: z.input<typeof removeInput>,
    sight?: Sight,
  ): Promise<Result<{ model: string; version: string; files: number; bytes: number }>> {
    const parsed = parseInput(removeInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version, force } = parsed.value;
    const rows = await this.db.mirrorFile.findMany({ where: { model, version } });
    if (rows.length === 0) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    const seen = (u: VersionUse) => !sight || u.owners.every((o) => sees(sight, o));
    const all = await this.reads.usedBy(model, version);
    const users = all.filter(seen);
    const hidden = all.filter((u) => !seen(u));
    const nameOf = (u: VersionUse) => (u.adapterOf ? `${u.name} (an adapter of ${u.adapterOf})` : u.name);
    const names = users.map(nameOf);
    if (users.length && !force) {
      return fail(
        new ConflictError(
          `${model}/${version} is the source of ${names.join(', ')}: change or remove those first, or remove it with force (their replicas will fail to load)`,
        ),
      );
    }
    const bytes = rows.reduce((n, r) => n + Number(r.bytesDone), 0);
    await this.db.$transaction(async (tx) => {
      await tx.mirrorFile.deleteMany({ where: { model, version } });
      await this.audit.done(tx, actor, {
        action: 'removeMirrorVersion',
        target: `${model}/${version}`,
        owner: (await versionOwner(tx, model, version))?.owner,
        message: `removed ${rows.length} file(s), ${bytes} bytes${users.length ? `; still used by ${names.join(', ')} (forced)` : ''}`,
      });
      // Each owner whose model or adapter loses its source is told, in a row only it (and admins) may read.
      for (const owner of new Set(hidden.flatMap((u) => u.owners))) {
        await this.audit.done(tx, actor, {
          action: 'removeMirrorVersion',
          target: `${model}/${version}`,
          owner,
          message: `removed by a caller who may not see them: still the source of ${hidden
            .filter((u) => u.owners.includes(owner))
            .map(nameOf)
            .join(', ')} (their replicas will fail to load)`,
        });
      }
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    for (const r of rows) {
      this.workers.abort(r.id);
      await this.dropPartial(r.id);
    }
    // In a bucket, blobs are shared by sha256: each goes once no remaining row names it.
    if (this.storage.bucket)
      await removeUnheldBlobs(
        this.db,
        this.storage.bucket,
        rows.map((r) => r.actualSha256),
      );
    await fs.rm(this.paths.version(model, version), { recursive: true, force: true });
    await fs.rmdir(path.dirname(this.paths.version(model, version))).catch(() => {});
    return ok({ model, version, files: rows.length, bytes });
  }
}

const bandwidthInput = z.object({
  bytesPerSecond: z
    .number()
    .int('a whole number of bytes per second')
    .refine((n) => n === 0 || (n >= 65_536 && n <= 1e12), 'at least 65536 (64 KiB/s), or 0 for no limit')
    .nullish(),
});

const removeInput = nameInput.extend({ force: z.boolean().nullish() });
