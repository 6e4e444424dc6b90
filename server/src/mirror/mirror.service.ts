import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { asLoop, type Db } from '../db/client.js';
import { LoopHealth, Stopped } from '../db/outage.js';
import type { MirrorFile, Prisma } from '../generated/prisma/client.js';
import {
  ConflictError,
  fail,
  NotFoundError,
  ok,
  type Result,
  UnloadableError,
  ValidationError,
} from '../lib/errors.js';
import type { Logger } from '../lib/log.js';
import { hubAuthorization, OutboundPolicy } from '../lib/outbound.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { Bandwidth, SLICE } from './bandwidth.js';
import { readFileKind } from './kind.js';
import { fileFromUrl, fileName, MirrorPaths, modelName, versionName } from './paths.js';
import {
  compareVersions,
  modelFamily,
  type VersionProgress,
  type VersionState,
  versionProgress,
  versionState,
} from './progress.js';
import { createStorageId, holdsAnything, MirrorStorageError, readStorageId } from './storage.js';
import { type RetryState, type TransferDone, type TransferFailed, transfer } from './transfer.js';

const sha256 = z
  .string()
  .regex(/^[0-9a-fA-F]{64}$/, 'a sha256 is 64 hexadecimal characters')
  .transform((s) => s.toLowerCase());

const sourceInput = z.object({
  url: z
    .string()
    .url('an absolute URL')
    .refine((u) => /^https?:\/\//.test(u), 'an http:// or https:// URL'),
  file: fileName.nullish(),
  sha256: sha256.nullish(),
  size: z.number().int().min(0, 'a size in bytes, 0 or more').nullish(),
});

const fetchInput = z.object({
  model: modelName,
  version: versionName,
  sources: z.array(sourceInput).min(1, 'at least one source').max(1000, 'at most 1000 files in one version'),
  force: z.boolean().nullish(),
  fetchAnyway: z.boolean().nullish(),
});

const nameInput = z.object({ model: modelName, version: versionName });

export type MirrorVersionView = {
  model: string;
  version: string;
  files: MirrorFile[];
  state: VersionState;
  progress: VersionProgress;
  /** A removed version, as the last event about it says. */
  removed: boolean;
};

/** What reading a file's header before its fetch found (registry/look.ts). */
export type SourceCheck = {
  /** Why the nodes' llama.cpp cannot load it; null when they can, or when the header was out of reach. */
  refusal: string | null;
  /** One line for the answer: what the file is, or why it was not checked. */
  note: string;
};
export type LookBeforeFetch = (files: { url: string; file: string }[]) => Promise<SourceCheck[]>;

export type FetchStarted = {
  version: MirrorVersionView;
  started: number;
  alreadyArriving: number;
  alreadyPresent: number;
  message: string;
};

const ACTIVE = ['QUEUED', 'FETCHING', 'VERIFYING'] as const;
const LEASE_MS = 30_000;
const PERSIST_MS = 1000;
/** What a row says once its transfer is not waiting to try again. */
const NO_RETRY = { retryAttempt: null, retryAt: null, retryReason: null } as const;

export class MirrorService {
  readonly paths: MirrorPaths;
  /**
   * Lets the server's own checks (the HEAD before a model is served) through when HANGAR_MIRROR_REQUIRE_TOKEN is
   * set. Random per process and never stored or shown.
   */
  readonly internalToken = `hgi_${randomUUID()}${randomUUID()}`;
  private readonly owner = `${process.pid}-${randomUUID().slice(0, 8)}`;
  /** This replica's mirror storage (storage.ts), known once openStorage() has accepted it. */
  storageId: string | null = null;
  private readonly transfers = new Map<string, AbortController>();
  /** What each of this process's running downloads still needs of the disk, by file id (reserveSpace). */
  private readonly reserved = new Map<string, number>();
  /** Which hosts and addresses the server fetches from (HANGAR_FETCH_ALLOW). */
  readonly outbound: OutboundPolicy;
  /** HANGAR_MIRROR_BANDWIDTH, shared by every download of this process. */
  readonly limit: Bandwidth;
  private readonly bandwidth: { slice(): number | null; take(n: number, signal?: AbortSignal): Promise<void> };
  /** Free bytes on the mirror's filesystem; replaced in tests that need a disk of a given size. */
  diskFree: () => Promise<number> = async () => {
    await fs.mkdir(this.paths.root, { recursive: true });
    const s = await fs.statfs(this.paths.root);
    return s.bavail * s.bsize;
  };
  private poll: NodeJS.Timeout | undefined;
  private running = false;
  private stopping = false;
  private ticking = false;
  private baseUrl: () => string = () => 'http://127.0.0.1';
  /** Reads GGUF headers before a fetch (set by the app: it needs the fleet's llama.cpp build); none, nothing is read. */
  private lookAt: LookBeforeFetch | null = null;
  /** The workers' view of the database: paused (not failed) while it is out of reach; /readyz reads it. */
  readonly health: LoopHealth;

  constructor(
    private readonly db: Db,
    private readonly audit: AuditService,
    private readonly config: Config,
    private readonly log: Logger,
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

  async versions(): Promise<MirrorVersionView[]> {
    const rows = await this.db.mirrorFile.findMany({
      orderBy: [{ model: 'asc' }, { version: 'asc' }, { file: 'asc' }],
    });
    const byVersion = new Map<string, MirrorFile[]>();
    for (const r of rows) {
      const key = `${r.model}\u0000${r.version}`;
      const list = byVersion.get(key) ?? [];
      list.push(r);
      byVersion.set(key, list);
    }
    return [...byVersion.values()].map((files) => view(files)).sort(compareVersions);
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
    const at = new Map<string, number>();
    for (const v of versions) {
      const name = modelFamily(v.model);
      let i = at.get(name);
      if (i === undefined) {
        i = out.push({ name, versions: [] }) - 1;
        at.set(name, i);
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
  private async stillNeeded(o: { states?: readonly string[]; notOwner?: string } = {}) {
    const states = [...(o.states ?? ACTIVE)];
    const mine = [...this.reserved.keys()];
    const rows = await this.db.$queryRaw<{ n: bigint | null }[]>`
      SELECT sum(greatest("bytesTotal" - "bytesDone", 0))::bigint AS n FROM "MirrorFile"
      WHERE state::text = ANY(${states}::text[]) AND "bytesTotal" IS NOT NULL
        AND NOT (id = ANY(${mine}::uuid[]))
        AND (${o.notOwner ?? null}::text IS NULL OR "leaseOwner" IS DISTINCT FROM ${o.notOwner ?? null}::text)`;
    return Number(rows[0]?.n ?? 0n);
  }

  /**
   * Room for a running download's `bytes` still to come: the disk's free space less what the other running
   * downloads still need (this process's from memory, so two that ask at once cannot both count the same free
   * bytes; other replicas' from the database). Reserved when it fits; otherwise the reason, before a byte of it
   * is written: three 120 MB files on 200 MB free would otherwise all start and all fail at 68 MB.
   */
  private async reserveSpace(id: string, file: string, bytes: number): Promise<string | null> {
    const [free, elsewhere] = await Promise.all([
      this.diskFree(),
      this.stillNeeded({ states: ['FETCHING', 'VERIFYING'], notOwner: this.owner }),
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
  async withKinds(v: MirrorVersionView): Promise<MirrorVersionView> {
    if (!v.files.some((f) => f.state === 'PRESENT' && f.kind === null)) return v;
    const files = await Promise.all(
      v.files.map(async (f) => {
        if (f.state !== 'PRESENT' || f.kind !== null) return f;
        const what = await readFileKind(this.paths.file(f.model, f.version, f.file), f.file);
        if (what.kind !== null)
          await this.db.mirrorFile.updateMany({ where: { id: f.id, state: 'PRESENT', kind: null }, data: what });
        return { ...f, ...what };
      }),
    );
    return { ...v, files };
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
        SELECT name, source, "minReplicas", "maxReplicas", declared, NULL::text AS "adapterOf"
          FROM "CatalogModel" WHERE source LIKE '%/mirror/%'
        UNION ALL
        SELECT a.name, a.source, m."minReplicas", m."maxReplicas", false, m.name
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

  // ─── changing ──────────────────────────────────────────────────────────────

  /**
   * Starts fetching a set of files into one version: one decision for a set of any size. Answered as started,
   * never as added: the bytes are still moving, and "added" would invite pointing the catalog at a partial file.
   */
  async fetch(ctx: Context, input: unknown): Promise<Result<FetchStarted>> {
    const parsed = parseInput(fetchInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version, sources, force, fetchAnyway } = parsed.value;
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
    const freeBytes = await this.freeBytes();
    if (needed > freeBytes) {
      return fail(
        new ConflictError(
          `not enough disk for ${model}/${version}: it needs ${needed} bytes and ${freeBytes} are free under ${this.paths.root} (after what the downloads under way still need); free space, or fetch fewer files`,
        ),
      );
    }

    const actor = describeRequester(ctx);
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
          storageId: this.storageId,
          requestedBy: actor,
          startedAt: null,
          finishedAt: null,
        };
        const row = existing.get(f.file);
        if (row) await tx.mirrorFile.update({ where: { id: row.id }, data: fresh });
        else await tx.mirrorFile.create({ data: { model, version, file: f.file, ...fresh } });
      }
      const parts = [`${toStart.length} of ${files.length} files started`];
      if (alreadyArriving) parts.push(`${alreadyArriving} already arriving`);
      if (alreadyPresent) parts.push(`${alreadyPresent} already present`);
      await this.audit.done(tx, ctx, {
        action: 'fetchToMirror',
        target: `${model}/${version}`,
        message: parts.join(', '),
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    // Files being refetched with force lose their old partials: a partial of the old upstream is no use.
    for (const f of toStart) {
      const row = existing.get(f.file);
      if (row) await fs.rm(this.paths.partial(row.id), { force: true });
    }
    this.kick();
    const view = (await this.version(model, version)) as MirrorVersionView;
    const message =
      toStart.length === 0
        ? alreadyArriving
          ? `nothing new to start: ${alreadyArriving} file(s) already arriving`
          : 'nothing to fetch: every file is already present (force fetches them again)'
        : `started fetching ${toStart.length} file${toStart.length === 1 ? '' : 's'} into ${model}/${version}${notes.length ? ` (${notes.join('; ')})` : ''}`;
    return ok({ version: view, started: toStart.length, alreadyArriving, alreadyPresent, message });
  }

  async cancel(ctx: Context, input: unknown): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    const cancellable = [...ACTIVE, 'PAUSED' as const];
    const rows = await this.db.mirrorFile.findMany({ where: { model, version, state: { in: cancellable } } });
    if (!(await this.version(model, version))) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
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
      await this.audit.done(tx, ctx, {
        action: 'cancelMirrorFetch',
        target: `${model}/${version}`,
        message: `${rows.length} file(s) cancelled`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    for (const r of rows) {
      this.transfers.get(r.id)?.abort();
      await fs.rm(this.paths.partial(r.id), { force: true });
    }
    return ok((await this.version(model, version)) as MirrorVersionView);
  }

  async retry(ctx: Context, input: unknown): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    const rows = await this.db.mirrorFile.findMany({
      where: { model, version, state: { in: ['FAILED', 'CANCELLED'] } },
    });
    if (!(await this.version(model, version))) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
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
            storageId: this.storageId,
            finishedAt: null,
          },
        });
      }
      await this.audit.done(tx, ctx, {
        action: 'retryMirrorFetch',
        target: `${model}/${version}`,
        message: `${rows.length} file(s) queued again`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    this.kick();
    return ok((await this.version(model, version)) as MirrorVersionView);
  }

  /**
   * Stops a version's downloads and keeps what they have: its files are never leased while paused, and resume
   * continues each with a Range request from where its partial ends. A file being verified finishes.
   */
  async pause(ctx: Context, input: unknown): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    if (!(await this.version(model, version))) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
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
      await this.audit.done(tx, ctx, {
        action: 'pauseMirrorFetch',
        target: `${model}/${version}`,
        message: `${rows.length} file(s) paused; their partials are kept`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    // This replica's transfers stop now; another replica's stop at their next progress write (the row is no
    // longer theirs), and keep the partial either way (finish).
    for (const r of rows) this.transfers.get(r.id)?.abort();
    return ok((await this.version(model, version)) as MirrorVersionView);
  }

  async resume(ctx: Context, input: unknown): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(nameInput, input, '');
    if (!parsed.ok) return parsed;
    const { model, version } = parsed.value;
    if (!(await this.version(model, version))) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
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
          data: { state: 'QUEUED', attempts: 0, bytesDone: BigInt(kept), storageId: this.storageId },
        });
      }
      await this.audit.done(tx, ctx, {
        action: 'resumeMirrorFetch',
        target: `${model}/${version}`,
        message: `${rows.length} file(s) queued again, each from its partial`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    this.kick();
    return ok((await this.version(model, version)) as MirrorVersionView);
  }

  /**
   * Changes the bandwidth limit every download of this server process shares, at once (the next bytes taken).
   * Not stored: a restart goes back to HANGAR_MIRROR_BANDWIDTH, which is where a lasting limit belongs.
   */
  async setBandwidth(ctx: Context, input: unknown): Promise<Result<{ bytesPerSecond: number | null }>> {
    const parsed = parseInput(
      z.object({
        bytesPerSecond: z
          .number()
          .int('a whole number of bytes per second')
          .refine((n) => n === 0 || (n >= 65_536 && n <= 1e12), 'at least 65536 (64 KiB/s), or 0 for no limit')
          .nullish(),
      }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const limit = parsed.value.bytesPerSecond ? parsed.value.bytesPerSecond : null;
    await this.db.$transaction(async (tx) => {
      await this.audit.done(tx, ctx, {
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

  async remove(
    ctx: Context,
    input: unknown,
  ): Promise<Result<{ model: string; version: string; files: number; bytes: number }>> {
    const parsed = parseInput(nameInput.extend({ force: z.boolean().nullish() }), input, '');
    if (!parsed.ok) return parsed;
    const { model, version, force } = parsed.value;
    const rows = await this.db.mirrorFile.findMany({ where: { model, version } });
    if (rows.length === 0) return fail(new NotFoundError(`the mirror has no ${model}/${version}`));
    const users = await this.usedBy(model, version);
    const names = users.map((u) => (u.adapterOf ? `${u.name} (an adapter of ${u.adapterOf})` : u.name));
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
      await this.audit.done(tx, ctx, {
        action: 'removeMirrorVersion',
        target: `${model}/${version}`,
        message: `removed ${rows.length} file(s), ${bytes} bytes${users.length ? `; still used by ${names.join(', ')} (forced)` : ''}`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    for (const r of rows) {
      this.transfers.get(r.id)?.abort();
      await fs.rm(this.paths.partial(r.id), { force: true });
    }
    await fs.rm(this.paths.version(model, version), { recursive: true, force: true });
    await fs.rmdir(path.dirname(this.paths.version(model, version))).catch(() => {});
    return ok({ model, version, files: rows.length, bytes });
  }

  /**
   * Keeps a file Hangar made (a trained adapter) in the mirror, verified like a fetch: written to a partial,
   * hashed, checked against the digest when one is given, and only then moved into place.
   */
  async upload(
    ctx: Pick<Context, 'viewer' | 'requestId'>,
    input: { model: string; version: string; file: string; sha256?: string | null; size?: number | null },
    body: AsyncIterable<Uint8Array>,
  ): Promise<Result<MirrorVersionView>> {
    const parsed = parseInput(
      nameInput.extend({ file: fileName, sha256: sha256.nullish(), size: z.number().int().min(0).nullish() }),
      input,
      '',
    );
    if (!parsed.ok) return parsed;
    const { model, version, file } = parsed.value;
    const existing = await this.db.mirrorFile.findUnique({ where: { model_version_file: { model, version, file } } });
    if (existing && existing.state !== 'FAILED' && existing.state !== 'CANCELLED') {
      return fail(
        new ConflictError(
          `${model}/${version}/${file} is already in the mirror (${existing.state.toLowerCase()}): versions are immutable; upload a new version`,
        ),
      );
    }
    const freeBytes = await this.freeBytes();
    if (parsed.value.size && parsed.value.size > freeBytes) {
      return fail(
        new ConflictError(`not enough disk: the upload is ${parsed.value.size} bytes and ${freeBytes} are free`),
      );
    }
    const row = existing
      ? await this.db.mirrorFile.update({
          where: { id: existing.id },
          data: { state: 'FETCHING', error: null, bytesDone: 0, storageId: this.storageId },
        })
      : await this.db.mirrorFile.create({
          data: {
            model,
            version,
            file,
            sourceUrl: `upload by ${describeRequester(ctx)}`,
            state: 'FETCHING',
            storageId: this.storageId,
            requestedBy: describeRequester(ctx),
            startedAt: new Date(),
          },
        });
    const partial = this.paths.partial(row.id);
    await fs.mkdir(path.dirname(partial), { recursive: true });
    const { createHash } = await import('node:crypto');
    const hash = createHash('sha256');
    let size = 0;
    const fh = await fs.open(partial, 'w');
    try {
      for await (const chunk of body) {
        await fh.write(chunk);
        hash.update(chunk);
        size += chunk.length;
      }
    } catch (err) {
      await fh.close();
      await fs.rm(partial, { force: true });
      await this.db.mirrorFile.update({
        where: { id: row.id },
        data: { state: 'FAILED', error: `the upload broke off after ${size} bytes: ${(err as Error).message}` },
      });
      throw err;
    }
    if (this.config.mirrorFsync) await fh.datasync(); // on the disk before it can be listed, like a fetch
    await fh.close();
    const digest = hash.digest('hex');
    const expected = parsed.value.sha256 ?? null;
    const badSize = parsed.value.size != null && parsed.value.size !== size;
    if ((expected && expected !== digest) || badSize) {
      await fs.rm(partial, { force: true });
      const error = badSize
        ? `the upload was ${size} bytes; ${parsed.value.size} were announced`
        : `sha256 mismatch: ${expected} was announced, the bytes hash to ${digest}`;
      await this.db.mirrorFile.update({ where: { id: row.id }, data: { state: 'FAILED', error, bytesDone: 0 } });
      return fail(new ValidationError('sha256', error));
    }
    await this.promote(row, partial);
    // What it holds, from its header, with the state that makes it listed: never a present file of unknown kind.
    const what = await readFileKind(this.paths.file(model, version, file), file);
    await this.db.$transaction(async (tx) => {
      await tx.mirrorFile.update({
        where: { id: row.id },
        data: {
          state: 'PRESENT',
          ...what,
          bytesDone: size,
          bytesTotal: size,
          actualSha256: digest,
          expectedSha256: expected,
          finishedAt: new Date(),
          error: null,
        },
      });
      await this.audit.done(tx, ctx, {
        action: 'uploadToMirror',
        target: `${model}/${version}/${file}`,
        message: `${size} bytes, sha256 ${digest}`,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
    return ok((await this.version(model, version)) as MirrorVersionView);
  }

  // ─── the workers ───────────────────────────────────────────────────────────

  /**
   * Finds this replica's mirror storage, or refuses to start (MirrorStorageError, nothing changed) when the
   * database's mirror is on storage this replica cannot see: another HANGAR_DATA_DIR, or a mount that is not
   * there. Either way, judging the files from here would fail every one of them. Run before start().
   */
  async openStorage() {
    const root = this.paths.root;
    const idFile = this.paths.storageIdFile;
    const where = `${root} (HANGAR_DATA_DIR=${this.config.dataDir})`;
    // The way on when the old storage is lost for good: this one takes its id, and start() fails what it lacks.
    const gone = (id: string) =>
      `If storage ${id} is gone for good and this one replaces it, write ${id} into ${idFile} and start again: the files missing here are then marked FAILED, and retry fetches them again.`;
    // Under a lock, so two replicas starting at once on fresh rows cannot both adopt them.
    const id = await this.db.$transaction(
      async (tx) => {
        await tx.$executeRaw`SELECT pg_advisory_xact_lock(hashtext('hangar.mirror.storage'))`;
        const recorded = (
          await tx.mirrorFile.groupBy({ by: ['storageId'], where: { storageId: { not: null } }, _count: true })
        )
          .map((g) => ({ id: g.storageId as string, files: g._count }))
          .sort((a, b) => a.id.localeCompare(b.id));
        const listed = (ids: typeof recorded) => ids.map((r) => `${r.id} (${r.files} files)`).join(', ');
        let id = await readStorageId(idFile);
        if (!id) {
          if (recorded.length)
            throw new MirrorStorageError(
              `the mirror's storage seems missing: ${idFile} is not there, but the database's mirror is on storage ${listed(recorded)}. ` +
                `Replicas that share a database share one mirror storage: mount it at ${where}, or point HANGAR_DATA_DIR at where it is mounted, and start again. Nothing was changed.${recorded.length === 1 ? ` ${gone(recorded[0]?.id as string)}` : ''}`,
            );
          const unrecorded = await tx.mirrorFile.count({ where: { state: 'PRESENT', storageId: null } });
          if (unrecorded && !(await holdsAnything(this.paths.files)))
            throw new MirrorStorageError(
              `the mirror's storage seems missing: the database lists ${unrecorded} present files, but ${where} holds none of them and no ${path.basename(idFile)}. ` +
                `Mount the mirror's storage there, or point HANGAR_DATA_DIR at it, and start again. Nothing was changed. If the files are gone for good, write a new id into ${idFile} (uuidgen > ${idFile}) and start again: the missing files are then marked FAILED, and retry fetches them again.`,
            );
          id = await createStorageId(idFile);
          this.log.info('the mirror storage has an id now', { storage: id, root });
        }
        const others = recorded.filter((r) => r.id !== id);
        if (others.length) {
          const mine = recorded.find((r) => r.id === id);
          throw new MirrorStorageError(
            `this replica's mirror storage is ${id} at ${where}, but the database's mirror holds files on storage ${listed(others)}${mine ? ` (and ${mine.files} on this one)` : ''}, which this replica cannot see. ` +
              `Replicas that share a database share one mirror storage: start this one with HANGAR_DATA_DIR on that shared filesystem (its ${path.basename(idFile)} reads ${others.map((o) => o.id).join(' or ')}). Nothing was changed.${mine || others.length > 1 ? '' : ` ${gone(others[0]?.id as string)}`}`,
          );
        }
        // Rows from before storages had ids are taken as on the first storage that starts with them (this one):
        // the files missing from it are then judged by start() as before.
        const adopted = await tx.mirrorFile.updateMany({ where: { storageId: null }, data: { storageId: id } });
        if (adopted.count)
          this.log.info('mirror files recorded before storage ids are on this storage', {
            storage: id,
            files: adopted.count,
          });
        return id;
      },
      { timeout: 30_000 },
    );
    this.storageId = id;
  }

  /** Picks up what a previous run left: unfinished files resume from their partials; vanished files are failed. */
  async start(embedded: boolean) {
    if (!this.storageId) await this.openStorage();
    await fs.mkdir(this.paths.partials, { recursive: true });
    if (embedded) {
      // The embedded database is this process's alone, so any lease in it is from a run that has ended.
      await this.db.mirrorFile.updateMany({
        where: { state: { in: ['FETCHING', 'VERIFYING'] } },
        data: { state: 'QUEUED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null },
      });
    }
    // Only this storage's files: another's are not this replica's to judge (openStorage refuses to start then).
    for (const r of await this.db.mirrorFile.findMany({ where: { state: 'PRESENT', storageId: this.storageId } })) {
      // A file deleted by hand, or cut short by a crash of the machine before the disk had it all (what ext4 and
      // XFS leave of bytes that were only in memory), must not go on looking ready.
      const size = await fs.stat(this.paths.file(r.model, r.version, r.file)).then(
        (st) => st.size,
        () => null,
      );
      const error =
        size === null
          ? 'the file is no longer on disk (removed by hand?): retry fetches it again'
          : r.bytesTotal !== null && BigInt(size) !== r.bytesTotal
            ? `the file on disk is ${size} bytes, not the ${r.bytesTotal} verified (the machine stopped before ` +
              'they reached the disk?): retry fetches it again'
            : null;
      if (!error) continue;
      this.log.warn('a present mirror file is not what was verified', {
        file: `${r.model}/${r.version}/${r.file}`,
        error,
      });
      await this.db.mirrorFile.updateMany({
        where: { id: r.id, state: 'PRESENT', storageId: this.storageId },
        data: { state: 'FAILED', error, bytesDone: 0 },
      });
      await notify(this.db, 'mirrorVersion', versionKey(r.model, r.version));
    }
    this.running = true;
    // Other replicas' queues and expired leases are noticed by polling; this process's own work by kick().
    this.poll = setInterval(() => this.kick(), 2000);
    this.kick();
  }

  async stop() {
    this.stopping = true;
    this.running = false;
    clearInterval(this.poll);
    for (const c of this.transfers.values()) c.abort();
    const deadline = Date.now() + 5000;
    while (this.transfers.size && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  }

  kick() {
    // While the database is away the poll still ticks, but tries again only after a backoff.
    if (!this.running || this.ticking || !this.health.due()) return;
    this.ticking = true;
    // The transfers it starts persist their progress from inside this, on the loops' connections.
    void asLoop(() => this.fill())
      .catch((err) => {
        if (err instanceof Stopped || this.health.failed(err)) return;
        this.log.error('mirror worker could not claim work', { error: err });
      })
      .finally(() => {
        this.ticking = false;
      });
  }

  private async fill() {
    while (this.running && this.transfers.size < this.config.mirrorConcurrency) {
      const row = await this.claim();
      this.health.ok();
      if (!row) return;
      const controller = new AbortController();
      this.transfers.set(row.id, controller);
      void this.run(row, controller)
        .catch((err) => this.log.error('mirror transfer crashed', { id: row.id, error: err }))
        .finally(() => {
          this.transfers.delete(row.id);
          this.reserved.delete(row.id);
          this.kick();
        });
    }
  }

  /** Takes the next file with a lease, atomically: with several replicas, exactly one works on each file. */
  private async claim(): Promise<MirrorFile | null> {
    // Never a file this process is still working on, however late its lease: a second transfer would append to
    // the same partial.
    const running = [...this.transfers.keys()];
    const rows = await this.db.$queryRaw<{ id: string }[]>`
      UPDATE "MirrorFile" SET state = 'FETCHING', "leaseOwner" = ${this.owner}, "storageId" = ${this.storageId},
        "leaseUntil" = now() + ${`${LEASE_MS} milliseconds`}::interval, attempts = attempts + 1,
        "retryAttempt" = NULL, "retryAt" = NULL, "retryReason" = NULL,
        "startedAt" = coalesce("startedAt", now()), "updatedAt" = now()
      WHERE id = (
        SELECT id FROM "MirrorFile"
        WHERE (state = 'QUEUED' OR (state IN ('FETCHING', 'VERIFYING') AND "leaseUntil" < now()))
          AND NOT (id = ANY(${running}::uuid[]))
          -- A partial on storage this replica cannot see is not its to resume.
          AND ("storageId" IS NULL OR "storageId" = ${this.storageId})
        ORDER BY "createdAt", file LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING id`;
    const id = rows[0]?.id;
    if (!id) return null;
    // Claimed now: an outage from here on must not lose the file to a lease that nobody works under.
    const row = await this.health.until(
      () => this.db.mirrorFile.findUniqueOrThrow({ where: { id } }),
      () => !this.running,
    );
    await notify(this.db, 'mirrorVersion', versionKey(row.model, row.version)).catch(() => {});
    return row;
  }

  /**
   * One file, from its claim to PRESENT or FAILED. When the database goes away under a transfer, the transfer
   * stops: this replica can neither record progress nor renew its lease, and with the lease lapsing another
   * replica could take the file over. The bytes stay in the partial; once the database answers, this worker takes
   * its lease up again and resumes with a Range request from where the partial ends.
   */
  private async run(claimed: MirrorFile, first: AbortController) {
    let row = claimed;
    let controller = first;
    try {
      for (;;) {
        const outcome = await this.attempt(row, controller);
        if (outcome !== 'paused') return await this.finish(row, outcome);
        const renewed = await this.health.until(
          () =>
            this.db.mirrorFile.updateMany({
              where: { id: row.id, state: 'FETCHING', leaseOwner: this.owner },
              data: { leaseUntil: new Date(Date.now() + LEASE_MS) },
            }),
          () => this.stopping,
        );
        // Cancelled, removed or taken over by another replica while the database was away: no longer ours.
        if (renewed.count === 0) return;
        row = await this.health.until(
          () => this.db.mirrorFile.findUniqueOrThrow({ where: { id: row.id } }),
          () => this.stopping,
        );
        controller = new AbortController();
        this.transfers.set(row.id, controller);
        this.log.info('resuming a download now that the database answers', {
          file: `${row.model}/${row.version}/${row.file}`,
        });
      }
    } catch (err) {
      // A shutdown while waiting for the database: the row stays FETCHING and the partial stays on disk; the next
      // start (or, with DATABASE_URL, the lease running out) resumes it from there.
      if (err instanceof Stopped) return;
      throw err;
    }
  }

  /** One transfer of the file; 'paused' when it was stopped because the database went out of reach. */
  private async attempt(
    row: MirrorFile,
    controller: AbortController,
  ): Promise<TransferDone | TransferFailed | 'paused'> {
    // Asked for by its sha256 and already held: not a byte is fetched (finish links it).
    const copy = row.expectedSha256 ? await this.heldCopy(row.expectedSha256, row.id) : null;
    if (copy && row.expectedSha256)
      return { ok: true, held: true, size: copy.size, sha256: row.expectedSha256, upstreamSha256: null, etag: null };
    const key = versionKey(row.model, row.version);
    const partial = this.paths.partial(row.id);
    const signal = controller.signal;
    let lastPersist = Date.now();
    let lastBytes = Number(row.bytesDone);
    let rate: number | null = null;
    let persisting: Promise<void> = Promise.resolve();
    const abortLocal = () => controller.abort();
    let paused = false;
    let complained = false;
    // A failed write never escapes as a rejection (one used to end the process): an outage pauses the transfer;
    // anything else is logged once and the transfer goes on (the final writes will say whether it still holds).
    const writeFailed = (err: unknown) => {
      if (this.health.failed(err)) {
        paused = true;
        abortLocal();
      } else if (!complained) {
        complained = true;
        this.log.warn("could not record a download's progress", { id: row.id, error: err });
      }
    };

    // Written only while this replica still holds the lease and nobody cancelled or paused: otherwise stop at once.
    const record = (data: Prisma.MirrorFileUpdateManyMutationInput) => {
      persisting = persisting
        .then(async () => {
          const { count } = await this.db.mirrorFile.updateMany({
            where: { id: row.id, state: 'FETCHING', leaseOwner: this.owner },
            data: { ...data, leaseUntil: new Date(Date.now() + LEASE_MS) },
          });
          this.health.ok();
          if (count === 0) abortLocal();
          else await notify(this.db, 'mirrorVersion', key);
        })
        .catch(writeFailed);
    };
    let lastByteAt = Date.now();
    const persist = (p: { bytesDone: number; bytesTotal: number | null; etag: string | null }) => {
      const now = Date.now();
      if (p.bytesDone !== lastBytes) lastByteAt = now;
      if (paused || now - lastPersist < PERSIST_MS) return;
      const instant = ((p.bytesDone - lastBytes) * 1000) / (now - lastPersist);
      rate = rate === null ? instant : rate * 0.7 + instant * 0.3; // smoothed, so the ETA does not jump about
      lastPersist = now;
      lastBytes = p.bytesDone;
      record({
        bytesDone: p.bytesDone,
        bytesTotal: p.bytesTotal ?? undefined,
        etag: p.etag,
        bytesPerSecond: rate,
        ...NO_RETRY,
      });
    };
    // While nothing arrives the rate is zero, not the last one heard: a row frozen at "3.6 MiB/s · about 1 min
    // left" through an outage tells the operator the download is fine when it is not.
    const quiet = setInterval(() => {
      if (paused || rate === 0 || Date.now() - lastByteAt < 2 * PERSIST_MS) return;
      rate = 0;
      record({ bytesPerSecond: 0 });
    }, PERSIST_MS);
    const onRetry = (retry: RetryState | null) => {
      if (paused || !retry) return; // cleared with the next bytes' progress
      rate = 0;
      record({
        bytesPerSecond: 0,
        retryAttempt: retry.attempt,
        retryAt: retry.nextAt,
        retryReason: retry.reason,
      });
    };

    // The lease is renewed on a clock too, not only as bytes arrive: a stalled upstream or a long backoff between
    // attempts must not let it lapse while this process still holds the file, or another worker takes it over.
    const heartbeat = setInterval(() => {
      this.db.mirrorFile
        .updateMany({
          where: { id: row.id, state: 'FETCHING', leaseOwner: this.owner },
          data: { leaseUntil: new Date(Date.now() + LEASE_MS) },
        })
        .then(({ count }) => count === 0 && abortLocal(), writeFailed);
    }, LEASE_MS / 3);
    const result = await transfer({
      url: row.sourceUrl,
      partialPath: partial,
      expectedSize: row.bytesTotal === null ? null : Number(row.bytesTotal),
      etag: row.etag,
      // The token goes to the Hub's own origin only; the download client drops it when a redirect leaves that
      // origin (the Hub sends LFS files to its CDN, which must not see it).
      headers: hubAuthorization(row.sourceUrl, this.config),
      guard: this.outbound,
      stallMs: this.config.mirrorStallSeconds * 1000,
      maxAttempts: this.config.mirrorAttempts,
      giveUpAfterMs: this.config.mirrorGiveUpAfterMs,
      retryMaxMs: this.config.mirrorRetryMaxMs,
      onRetry,
      throttle: this.bandwidth,
      alreadyHeld: async (sha) => (await this.heldCopy(sha, row.id)) !== null,
      fsync: this.config.mirrorFsync,
      signal,
      onProgress: (p) => {
        // What is reserved shrinks as the bytes land: from then on the disk's free space counts them.
        if (p.bytesTotal !== null && this.reserved.has(row.id))
          this.reserved.set(row.id, Math.max(0, p.bytesTotal - p.bytesDone));
        persist(p);
      },
      reserveSpace: (bytes) => this.reserveSpace(row.id, `${row.model}/${row.version}/${row.file}`, bytes),
      log: (msg, fields) => this.log.info(msg, { ...fields, file: `${row.model}/${row.version}/${row.file}` }),
    }).finally(() => {
      clearInterval(heartbeat);
      clearInterval(quiet);
    });
    await persisting;
    if (paused && !result.ok && result.reason === 'cancelled') return 'paused';
    return result;
  }

  /**
   * Writes down what the transfer came to. Each write waits out a database outage rather than being dropped: a
   * verified file is recorded PRESENT when the database returns, not downloaded again.
   */
  private async finish(row: MirrorFile, result: TransferDone | TransferFailed) {
    const key = versionKey(row.model, row.version);
    const partial = this.paths.partial(row.id);
    const write = <T>(fn: () => Promise<T>) => this.health.until(fn, () => this.stopping);
    // Best effort: when the database is away, so is every listener, and a client that reconnects reads afresh.
    const tell = () => notify(this.db, 'mirrorVersion', key).catch(() => {});

    const mine = { id: row.id, leaseOwner: this.owner };
    if (!result.ok) {
      if (result.reason === 'cancelled') {
        if (this.stopping) {
          // A shutdown, not a cancel: back in the queue, to resume from the partial at the next start.
          await this.db.mirrorFile
            .updateMany({
              where: { ...mine, state: 'FETCHING' },
              data: { state: 'QUEUED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null, ...NO_RETRY },
            })
            .catch((err) =>
              this.log.warn('could not put a download back in the queue; it resumes when its lease runs out', {
                id: row.id,
                error: err,
              }),
            );
        } else {
          // Paused keeps its partial for the resume (and one resumed at once may already be another worker's);
          // only a cancelled or removed file's bytes are of no more use.
          const now = await this.db.mirrorFile.findUnique({ where: { id: row.id } }).catch(() => undefined);
          if (now === null || now?.state === 'CANCELLED') await fs.rm(partial, { force: true });
          else if (now?.state === 'PAUSED') {
            const kept = await fs.stat(partial).then(
              (st) => st.size,
              () => 0,
            );
            await this.db.mirrorFile
              .updateMany({ where: { id: row.id, state: 'PAUSED' }, data: { bytesDone: kept } })
              .then(tell, () => {});
          }
        }
        return;
      }
      if (!result.keepPartial) await fs.rm(partial, { force: true });
      const kept = result.keepPartial
        ? await fs.stat(partial).then(
            (s) => s.size,
            () => 0,
          )
        : 0;
      await write(() =>
        this.db.mirrorFile.updateMany({
          where: { ...mine, state: 'FETCHING' },
          data: {
            state: 'FAILED',
            error: result.reason,
            bytesDone: kept,
            bytesPerSecond: null,
            ...NO_RETRY,
            leaseOwner: null,
            leaseUntil: null,
            finishedAt: new Date(),
          },
        }),
      );
      this.log.warn('mirror file failed', { file: `${row.model}/${row.version}/${row.file}`, reason: result.reason });
      await tell();
      return;
    }

    // The same bytes once: a file whose sha256 the mirror already holds, verified, becomes a hard link to it,
    // whether that was known before the download (held) or only once its bytes were hashed.
    const copy = await this.heldCopy(result.sha256, row.id);
    if (result.held && !copy) {
      // The copy went (removed) between the look and now: download the file after all.
      await write(() =>
        this.db.mirrorFile.updateMany({
          where: { ...mine, state: 'FETCHING' },
          data: { state: 'QUEUED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null, ...NO_RETRY },
        }),
      );
      this.kick();
      return;
    }
    const size = result.held && copy ? copy.size : result.size;
    const { count: stillMine } = await write(() =>
      this.db.mirrorFile.updateMany({
        where: { ...mine, state: 'FETCHING' },
        data: {
          state: 'VERIFYING',
          bytesDone: size,
          bytesTotal: size,
          bytesPerSecond: null,
          etag: result.etag,
          ...NO_RETRY,
        },
      }),
    );
    // Cancelled, removed or taken over meanwhile: the bytes are not this worker's to verify or to put in place,
    // where they would replace a file another worker verified.
    if (stillMine === 0) return;
    await tell();
    const expected = row.expectedSha256 ?? result.upstreamSha256;
    if (expected && expected !== result.sha256) {
      await fs.rm(partial, { force: true });
      await write(() =>
        this.db.mirrorFile.updateMany({
          where: mine,
          data: {
            state: 'FAILED',
            error: `sha256 mismatch: ${row.expectedSha256 ? 'expected' : 'the upstream published'} ${expected}, the bytes hash to ${result.sha256}; the download was discarded`,
            bytesDone: 0,
            actualSha256: result.sha256,
            leaseOwner: null,
            leaseUntil: null,
            finishedAt: new Date(),
          },
        }),
      );
      await tell();
      return;
    }
    await this.promote(row, partial, copy?.path);
    if (copy)
      this.log.info('the mirror already held these bytes: linked, not stored twice', {
        file: `${row.model}/${row.version}/${row.file}`,
        sha256: result.sha256,
        from: copy.path,
        downloaded: !result.held,
      });
    const what = await readFileKind(this.paths.file(row.model, row.version, row.file), row.file);
    await write(() =>
      this.db.mirrorFile.updateMany({
        where: mine,
        data: {
          state: 'PRESENT',
          ...what,
          actualSha256: result.sha256,
          expectedSha256: expected,
          error: null,
          leaseOwner: null,
          leaseUntil: null,
          finishedAt: new Date(),
        },
      }),
    );
    await tell();
  }

  /**
   * A present, verified file with these bytes on this storage, other than `except`, that is still on disk with
   * its verified size: what a new file with the same sha256 is linked to.
   */
  private async heldCopy(sha: string, except: string): Promise<{ path: string; size: number } | null> {
    const rows = await this.db.mirrorFile.findMany({
      where: {
        actualSha256: sha,
        expectedSha256: sha,
        state: 'PRESENT',
        storageId: this.storageId,
        id: { not: except },
      },
      orderBy: { finishedAt: 'asc' },
      take: 5,
    });
    for (const r of rows) {
      const file = this.paths.file(r.model, r.version, r.file);
      const size = await fs.stat(file).then(
        (st) => st.size,
        () => null,
      );
      if (size !== null && (r.bytesTotal === null || BigInt(size) === r.bytesTotal)) return { path: file, size };
    }
    return null;
  }

  /**
   * Only a verified file is moved to where it is listed and served; rename is atomic on one filesystem. With a
   * `copy` of the same bytes, the listed file is a hard link to it instead: one set of blocks on the disk, freed
   * by the filesystem only once no version links them any more.
   */
  private async promote(row: Pick<MirrorFile, 'model' | 'version' | 'file'>, partial: string, copy?: string) {
    const target = this.paths.file(row.model, row.version, row.file);
    await fs.mkdir(path.dirname(target), { recursive: true });
    if (copy) {
      // Linked beside the target, then renamed over it: a file refetched with force is replaced in one step.
      const tmp = path.join(this.paths.partials, `${randomUUID()}.link`);
      const linked = await fs.link(copy, tmp).then(
        () => true,
        (err: NodeJS.ErrnoException) => {
          // A filesystem without hard links (or the copy on another one): stored twice, but stored.
          this.log.warn('could not hard-link a file the mirror already holds; keeping its own bytes', {
            file: target,
            error: err.code ?? err.message,
          });
          return false;
        },
      );
      if (linked) {
        await fs.rename(tmp, target);
        await fs.rm(partial, { force: true });
      } else if (
        await fs.stat(partial).then(
          () => true,
          () => false,
        )
      )
        await fs.rename(partial, target);
      else await fs.copyFile(copy, target);
    } else await fs.rename(partial, target);
    if (!this.config.mirrorFsync) return;
    // The rename is on the disk too, not only the bytes (transfer flushed them): then a file marked PRESENT is
    // there after the machine restarts.
    const dir = await fs.open(path.dirname(target), 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
  }
}

export function versionKey(model: string, version: string) {
  return `${model}/${version}`;
}

/** A catalog model or adapter whose source is in a version, with the scaling of the replicas that load it. */
export type VersionUse = {
  name: string;
  minReplicas: number;
  maxReplicas: number;
  declared: boolean;
  /** For an adapter, the catalog model it runs on; null for a model. */
  adapterOf: string | null;
};

/** A version as a source URL spells it (names URL-encoded): the key usesByVersion answers by. */
export function sourceKey(model: string, version: string) {
  return `${encodeURIComponent(model)}/${encodeURIComponent(version)}`;
}

/**
 * Every version a source URL points into: each "/mirror/<model>/<version>/" in it, as sourceKeys. The same
 * versions a search for that text finds, so a source named twice (a proxy's path before ours) counts for both.
 */
export function mirrorVersionsIn(source: string): Set<string> {
  const keys = new Set<string>();
  for (let at = source.indexOf('/mirror/'); at >= 0; at = source.indexOf('/mirror/', at + 1)) {
    const m = /^\/mirror\/([^/]+)\/([^/]+)\//.exec(source.slice(at));
    if (m) keys.add(`${m[1]}/${m[2]}`);
  }
  return keys;
}

function view(files: MirrorFile[]): MirrorVersionView {
  const first = files[0] as MirrorFile;
  return {
    model: first.model,
    version: first.version,
    files,
    state: versionState(files),
    progress: versionProgress(files),
    removed: false,
  };
}

function describeRequester(ctx: Pick<Context, 'viewer'>) {
  const v = ctx.viewer;
  if (v.kind === 'user' || v.kind === 'token') return v.user.email;
  if (v.kind === 'node') return `node:${v.node.name}`;
  return 'anonymous';
}
