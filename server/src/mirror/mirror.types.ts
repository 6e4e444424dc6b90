import type { MirrorFile } from '../generated/prisma/client.js';
import { MirrorFileState } from '../generated/prisma/enums.js';
import type { Sight } from '../org/org.service.js';
import { sees, sightLoaded, sightOf } from '../org/visible.js';
import { builder } from '../schema/builder.js';
import { versionArchitecture, versionKindOf } from './kind.js';
import { type FetchStarted, type MirrorVersionView, sourceKey, type VersionUse, versionKey } from './mirror.service.js';

// The mirror's GraphQL types (versions, files, families, the overview); mirror.schema.ts holds the query,
// mutation and subscription fields over them and imports this file first, so the types register before the fields.

const MirrorFileStateEnum = builder.enumType(MirrorFileState, { name: 'MirrorFileState' });
const MirrorVersionStateEnum = builder.enumType('MirrorVersionState', {
  values: ['QUEUED', 'FETCHING', 'VERIFYING', 'PRESENT', 'FAILED', 'CANCELLED', 'PAUSED'] as const,
  description:
    "Summed from the version's files: any arriving → FETCHING; else any paused → PAUSED; else any failed → FAILED; all present → PRESENT.",
});

type Retry = { attempt: number; nextAt: Date; reason: string };
const MirrorRetry = builder.objectRef<Retry>('MirrorRetry').implement({
  description:
    'A download waiting to try its upstream again: "retrying (attempt 3, next in 20 s): could not reach the upstream (ECONNREFUSED)".',
  fields: (t) => ({
    attempt: t.exposeInt('attempt', { description: 'The try that comes next, counted since the last byte arrived.' }),
    nextAt: t.expose('nextAt', { type: 'DateTime' }),
    reason: t.exposeString('reason', { description: 'What went wrong with the last try.' }),
  }),
});

/** A file's wait to try again, while it is arriving and waiting. */
function retryOf(f: MirrorFile): Retry | null {
  if (f.state !== 'FETCHING' || f.retryAttempt === null || f.retryAt === null) return null;
  return { attempt: f.retryAttempt, nextAt: f.retryAt, reason: f.retryReason ?? 'the last try failed' };
}

/**
 * Bytes on the disk, each set once: present files with one sha256 are hard links to one copy (the mirror links
 * a file it already holds rather than storing it again). Partials and unhashed files count as they are.
 */
export function bytesOnDisk(files: Iterable<MirrorFile>): number {
  const seen = new Set<string>();
  let n = 0;
  for (const f of files) {
    if (f.state === 'PRESENT' && f.actualSha256) {
      if (seen.has(f.actualSha256)) continue;
      seen.add(f.actualSha256);
    }
    n += Number(f.bytesDone);
  }
  return n;
}
export const ModelMode = builder.enumType('ModelMode', { values: ['ALWAYS', 'ON_DEMAND', 'STOPPED'] as const });

const MirrorFileRef = builder.prismaObject('MirrorFile', {
  fields: (t) => ({
    id: t.exposeID('id'),
    file: t.exposeString('file'),
    state: t.expose('state', { type: MirrorFileStateEnum }),
    bytesDone: t.field({ type: 'Bytes', resolve: (f) => f.bytesDone }),
    bytesTotal: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'Null until the upstream says.',
      resolve: (f) => f.bytesTotal,
    }),
    bytesPerSecond: t.float({ nullable: true, resolve: (f) => (f.state === 'FETCHING' ? f.bytesPerSecond : null) }),
    expectedSha256: t.exposeString('expectedSha256', {
      nullable: true,
      description: 'What the upstream or the request published.',
    }),
    sha256: t.exposeString('actualSha256', { nullable: true, description: 'What the bytes hash to, once fetched.' }),
    verified: t.boolean({
      description: 'Present and matching a published sha256. A present file with no published digest is unverified.',
      resolve: (f) => f.state === 'PRESENT' && f.expectedSha256 !== null && f.expectedSha256 === f.actualSha256,
    }),
    error: t.exposeString('error', { nullable: true }),
    attempts: t.exposeInt('attempts'),
    retry: t.field({
      type: MirrorRetry,
      nullable: true,
      description: 'Set while the file waits to try its upstream again; null while bytes move.',
      resolve: (f) => retryOf(f),
    }),
    sourceUrl: t.exposeString('sourceUrl'),
    url: t.string({
      nullable: true,
      description: 'Where nodes fetch it: only once present.',
      resolve: (f, _args, ctx) => (f.state === 'PRESENT' ? ctx.services.mirror.fileUrl(f) : null),
    }),
    updatedAt: t.expose('updatedAt', { type: 'DateTime' }),
  }),
});

const ModelUse = builder.objectRef<VersionUse>('ModelUse').implement({
  description:
    "A catalog model or adapter whose source is in this version, and how it runs (an adapter: its model's replicas).",
  fields: (t) => ({
    name: t.exposeString('name'),
    mode: t.field({
      type: ModelMode,
      resolve: (m) => (m.maxReplicas === 0 ? 'STOPPED' : m.minReplicas === 0 ? 'ON_DEMAND' : 'ALWAYS'),
    }),
    replicas: t.int({ resolve: (m) => m.minReplicas }),
    maxReplicas: t.int({
      description: 'How many replicas the model may run: an on-demand model has none running when idle (replicas 0).',
      resolve: (m) => m.maxReplicas,
    }),
    declared: t.exposeBoolean('declared'),
    adapterOf: t.exposeString('adapterOf', {
      nullable: true,
      description: 'For an adapter, the catalog model it runs on; null for a model.',
    }),
  }),
});

// One load of every model's and adapter's source per query (MirrorService.usesByVersion: one SQL statement),
// matched here to each row, so the Mirror page's query takes 3 round-trips at any version count (the files, the
// free space, the models and adapters; the caller's credential aside), where one query per row took 203 at 200.
// Cached on the request's context; only for queries: a subscription's context lives for all of its events, and a
// mutation may change the catalog between two of its fields.
type Uses = { loading: Promise<Map<string, VersionUse[]>>; loaded?: Map<string, VersionUse[]> };
const usesPerQuery = new WeakMap<object, Uses>();

function usesOf(ctx: { services: { mirror: { usesByVersion(): Promise<Map<string, VersionUse[]>> } } }): Uses {
  let uses = usesPerQuery.get(ctx);
  if (!uses) {
    const entry: Uses = { loading: ctx.services.mirror.usesByVersion() };
    entry.loading.then((m) => (entry.loaded = m)).catch(() => {});
    usesPerQuery.set(ctx, entry);
    uses = entry;
  }
  return uses;
}

/**
 * Loads the uses with the listing, before its versions resolve (Query.mirror): each version's usedBy then answers
 * at once from the loaded map. Were it a promise, graphql-js would resolve every one of 5000 version objects
 * asynchronously, a third of the Mirror page's query (bench/mirror-query.ts).
 */
export async function loadUsesFirst(ctx: Parameters<typeof usesOf>[0]): Promise<void> {
  await usesOf(ctx).loading;
}

const MirrorVersionKindEnum = builder.enumType('MirrorVersionKind', {
  description:
    "What a version holds, read from its files' headers (general.type, adapter.type, a clip architecture): only MODEL is served as a model. UNKNOWN until every file is present and read.",
  values: ['MODEL', 'ADAPTER', 'MMPROJ', 'IMATRIX', 'UNKNOWN'] as const,
});

// A version's files with their kinds, read once per version object (rows from before kinds were kept are read from
// their headers on first use, and the answer stored).
const kindsOf = new WeakMap<MirrorVersionView, Promise<MirrorVersionView>>();
function withKinds(
  v: MirrorVersionView,
  ctx: { services: { mirror: { withKinds(v: MirrorVersionView): Promise<MirrorVersionView> } } },
) {
  let known = kindsOf.get(v);
  if (!known) {
    known = ctx.services.mirror.withKinds(v);
    kindsOf.set(v, known);
  }
  return known;
}

export const MirrorVersionRef = builder.objectRef<MirrorVersionView>('MirrorVersion').implement({
  description: 'A model version: one row for the operator, whatever its file count.',
  fields: (t) => ({
    id: t.id({ resolve: (v) => versionKey(v.model, v.version) }),
    model: t.exposeString('model'),
    version: t.exposeString('version'),
    state: t.field({ type: MirrorVersionStateEnum, resolve: (v) => v.state }),
    removed: t.exposeBoolean('removed', {
      description: 'True only in the last event about a version that was removed.',
    }),
    kind: t.field({
      type: MirrorVersionKindEnum,
      resolve: async (v, _args, ctx) => (v.removed ? 'UNKNOWN' : versionKindOf((await withKinds(v, ctx)).files)),
    }),
    architecture: t.string({
      nullable: true,
      description: "general.architecture of its main file: a model's, or the base an adapter is for.",
      resolve: async (v, _args, ctx) => (v.removed ? null : versionArchitecture((await withKinds(v, ctx)).files)),
    }),
    fileCount: t.int({ resolve: (v) => v.files.length }),
    files: t.field({ type: [MirrorFileRef], resolve: (v) => v.files }),
    bytesDone: t.field({ type: 'Bytes', resolve: (v) => v.progress.bytesDone }),
    bytesTotal: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'Null while any file size is unknown.',
      resolve: (v) => v.progress.bytesTotal,
    }),
    percent: t.float({
      nullable: true,
      description: 'Only when the total is known; never invented.',
      resolve: (v) => v.progress.percent,
    }),
    bytesPerSecond: t.float({ nullable: true, resolve: (v) => v.progress.bytesPerSecond }),
    etaSeconds: t.int({ nullable: true, resolve: (v) => v.progress.etaSeconds }),
    retry: t.field({
      type: MirrorRetry,
      nullable: true,
      description:
        'Set while every file arriving waits to try its upstream again (the one due first); null while any bytes move.',
      resolve: (v) => {
        const arriving = v.files.filter((f) => f.state === 'FETCHING');
        const waits = arriving.map(retryOf);
        if (!waits.length || waits.some((w) => w === null)) return null;
        return (waits as Retry[]).sort((a, b) => a.nextAt.getTime() - b.nextAt.getTime())[0] ?? null;
      },
    }),
    error: t.string({
      nullable: true,
      description: "The first failed file's reason, and how many failed.",
      resolve: (v) => {
        const failed = v.files.filter((f) => f.state === 'FAILED');
        if (!failed.length) return null;
        const more = failed.length > 1 ? ` (and ${failed.length - 1} more failed)` : '';
        return `${v.files.length > 1 ? `${failed[0]?.file}: ` : ''}${failed[0]?.error ?? 'failed'}${more}`;
      },
    }),
    verified: t.boolean({
      resolve: (v) =>
        v.state === 'PRESENT' && v.files.every((f) => f.expectedSha256 !== null && f.expectedSha256 === f.actualSha256),
    }),
    url: t.string({
      nullable: true,
      description: 'What a catalog entry should use: the version folder, once every file is present.',
      resolve: (v, _args, ctx) => (v.state === 'PRESENT' ? ctx.services.mirror.versionUrl(v.model, v.version) : null),
    }),
    usedBy: t.field({
      type: [ModelUse],
      description: 'The models and adapters the caller may call whose source is in this version.',
      resolve: (v, _args, ctx, info) => {
        if (v.removed) return [];
        // An event's every subscriber gets the same uses from one read (pubsub.ts: shared), each seeing its own.
        if (info.operation.operation === 'subscription') {
          return Promise.all([
            ctx.pubsub.shared('mirrorVersion', versionKey(v.model, v.version), 'usedBy', () =>
              ctx.services.mirror.usedBy(v.model, v.version),
            ),
            sightOf(ctx, info),
          ]).then(([uses, sight]) => seenUses(sight, uses));
        }
        if (info.operation.operation !== 'query')
          return Promise.all([ctx.services.mirror.usedBy(v.model, v.version), sightOf(ctx, info)]).then(
            ([uses, sight]) => seenUses(sight, uses),
          );
        const uses = usesOf(ctx);
        const key = sourceKey(v.model, v.version);
        // At once when both are loaded (Query.mirror loads them first): 5000 promises would cost a third of the page.
        const sight = sightLoaded(ctx, info);
        if (uses.loaded && sight) return seenUses(sight, uses.loaded.get(key) ?? []);
        return Promise.all([uses.loading, sightOf(ctx, info)]).then(([m, s]) => seenUses(s, m.get(key) ?? []));
      },
    }),
    updatedAt: t.field({
      type: 'DateTime',
      nullable: true,
      resolve: (v) => (v.files.length ? new Date(Math.max(...v.files.map((f) => f.updatedAt.getTime()))) : null),
    }),
  }),
});

/** The uses a caller may see: a model or adapter it may not call is not named (org-owners.ts `sees`). */
function seenUses(sight: Sight, uses: VersionUse[]): VersionUse[] {
  return sight.admin ? uses : uses.filter((u) => u.owners.every((o) => sees(sight, o)));
}

type Family = { name: string; versions: MirrorVersionView[] };
const MirrorFamily = builder.objectRef<Family>('MirrorFamily').implement({
  description: "Versions grouped by the letters their model's name starts with: every qwen, every llama.",
  fields: (t) => ({
    name: t.exposeString('name'),
    modelCount: t.int({ resolve: (f) => new Set(f.versions.map((v) => v.model)).size }),
    bytes: t.field({
      type: 'Bytes',
      description: 'On the disk, a file held by several versions counted once.',
      resolve: (f) => bytesOnDisk(f.versions.flatMap((v) => v.files)),
    }),
    fetching: t.int({
      resolve: (f) => f.versions.filter((v) => ['QUEUED', 'FETCHING', 'VERIFYING'].includes(v.state)).length,
    }),
    failed: t.int({ resolve: (f) => f.versions.filter((v) => v.state === 'FAILED').length }),
    versions: t.field({ type: [MirrorVersionRef], resolve: (f) => f.versions }),
  }),
});

type Overview = { versions: MirrorVersionView[]; freeBytes: number };
export const Mirror = builder.objectRef<Overview>('Mirror').implement({
  fields: (t) => ({
    baseUrl: t.string({ resolve: (_m, _args, ctx) => ctx.services.mirror.base() }),
    fetching: t.int({
      description: 'Versions arriving.',
      resolve: (m) => m.versions.filter((v) => ['QUEUED', 'FETCHING', 'VERIFYING'].includes(v.state)).length,
    }),
    present: t.int({ resolve: (m) => m.versions.filter((v) => v.state === 'PRESENT').length }),
    failed: t.int({ resolve: (m) => m.versions.filter((v) => v.state === 'FAILED').length }),
    diskUsedBytes: t.field({
      type: 'Bytes',
      description:
        'What the versions hold on disk (on a bucket: in the bucket), partials included; bytes several versions share counted once.',
      resolve: (m) => bytesOnDisk(m.versions.flatMap((v) => v.files)),
    }),
    bandwidthLimit: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'Bytes per second all downloads share (HANGAR_MIRROR_BANDWIDTH); null for no limit.',
      resolve: (_m, _a, ctx) => ctx.services.mirror.limit.limit,
    }),
    diskFreeBytes: t.field({
      type: 'Bytes',
      description:
        'Room for new files: free disk under the data dir, less what downloads under way still need; on a bucket, what HANGAR_S3_QUOTA leaves of it (no quota: 2^53-1, no limit).',
      resolve: (m) => m.freeBytes,
    }),
    bucket: t.string({
      nullable: true,
      description:
        'Where the files are kept when in a bucket (HANGAR_MIRROR_STORE=s3://bucket/prefix); null on the data dir. On a bucket, diskUsedBytes is what the mirror holds there.',
      resolve: (_m, _a, ctx) => ctx.services.mirror.bucket?.where ?? null,
    }),
    bucketQuotaBytes: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'HANGAR_S3_QUOTA: what the mirror may keep in its bucket; null for no quota, or on the data dir.',
      resolve: (_m, _a, ctx) => (ctx.services.mirror.bucket ? ctx.config.s3QuotaBytes : null),
    }),
    bucketListedBytes: t.field({
      type: 'Bytes',
      nullable: true,
      authScopes: { operator: true },
      description:
        "What a listing of the bucket's blobs adds up to now, to check the figures kept in PostgreSQL against the bucket (a ListObjects scan, a request per 1,000 objects: only when asked); null on the data dir.",
      resolve: async (_m, _a, ctx) => {
        const bucket = ctx.services.mirror.bucket;
        return bucket ? (await bucket.usage()).usedBytes : null;
      },
    }),
    families: t.field({ type: [MirrorFamily], resolve: (m, _a, ctx) => ctx.services.mirror.families(m.versions) }),
    versions: t.field({
      type: [MirrorVersionRef],
      description: 'Every version, in the listing order.',
      resolve: (m) => m.versions,
    }),
  }),
});

export const MirrorSourceInput = builder.inputType('MirrorSourceInput', {
  fields: (t) => ({
    url: t.string({ required: true }),
    file: t.string({
      required: false,
      description: "The file's name in the version; defaults to the URL's last part.",
    }),
    sha256: t.string({
      required: false,
      description: 'The published digest; without one, the file is kept unverified.',
    }),
    size: t.field({ type: 'Bytes', required: false, description: 'The expected size, checked before and after.' }),
  }),
});

export const FetchStartedRef = builder.objectRef<FetchStarted>('FetchStarted').implement({
  description: 'The fetch has started: the bytes are still moving. Watch the version for when it is present.',
  fields: (t) => ({
    version: t.field({ type: MirrorVersionRef, resolve: (r) => r.version }),
    started: t.exposeInt('started'),
    alreadyArriving: t.exposeInt('alreadyArriving'),
    alreadyPresent: t.exposeInt('alreadyPresent'),
    message: t.exposeString('message'),
  }),
});

export const RemovedMirrorVersion = builder
  .objectRef<{ model: string; version: string; files: number; bytes: number }>('RemovedMirrorVersion')
  .implement({
    fields: (t) => ({
      id: t.id({ resolve: (r) => versionKey(r.model, r.version) }),
      model: t.exposeString('model'),
      version: t.exposeString('version'),
      files: t.exposeInt('files'),
      bytes: t.field({ type: 'Bytes', resolve: (r) => r.bytes }),
    }),
  });

export const MirrorBandwidth = builder.objectRef<{ bytesPerSecond: number | null }>('MirrorBandwidth').implement({
  description: "The mirror's bandwidth limit, as it now holds.",
  fields: (t) => ({
    bytesPerSecond: t.field({
      type: 'Bytes',
      nullable: true,
      description: 'Null: no limit.',
      resolve: (b) => b.bytesPerSecond,
    }),
  }),
});
