import { type ByteSource, fileSource } from '@hangar/common/gguf/source';
import { mirrorSourceUses } from '../catalog/catalog-store.js';
import type { Db } from '../db/client.js';
import type { MirrorFile } from '../generated/prisma/client.js';
import { type FileWhat, readFileKind } from './kind.js';
import { type MirrorVersionView, mirrorVersionsIn, sourceKey, type VersionUse, view } from './mirror-view.js';
import { blobSource, readBlobKind } from './on-bucket.js';
import type { MirrorPaths } from './paths.js';
import { compareVersions, modelFamily, versionProgress } from './progress.js';
import type { MirrorStore } from './store/store.js';

// What reads the mirror's rows: versions, families, what each file holds, who uses what. Writes nothing but a
// file's kind once it is known (withKinds); the rest of the service composes it (mirror.service.ts).

/** Past this many rows changed since the last listing, it reads every row rather than name them one by one. */
const CHANGED_READ_MAX = 500;

export class MirrorReads {
  private readonly db: Db;
  private readonly paths: MirrorPaths;
  /** The bucket the bytes are in (HANGAR_MIRROR_STORE=s3://…), known once the storage is open; null on `file`. */
  private readonly bucket: () => MirrorStore | null;

  constructor(o: { db: Db; paths: MirrorPaths; bucket: () => MirrorStore | null }) {
    this.db = o.db;
    this.paths = o.paths;
    this.bucket = o.bucket;
  }

  /**
   * A present file's bytes, read by offset (a GGUF's header): from its blob by Range requests on a bucket, else
   * from its file under the data dir. Throws when they are not there (removed by hand, or by a lost race).
   */
  async openBytes(f: Pick<MirrorFile, 'model' | 'version' | 'file' | 'actualSha256'>): Promise<ByteSource> {
    const bucket = this.bucket();
    if (!bucket) return fileSource(this.paths.file(f.model, f.version, f.file));
    const held = f.actualSha256 ? await bucket.stat(f.actualSha256) : null;
    if (!held || !f.actualSha256) throw new Error(`${f.model}/${f.version}/${f.file} is not in the mirror's bucket`);
    return blobSource(bucket, f.actualSha256, held.size);
  }

  /** A small present file whole, as text (a model's config.json), wherever its bytes are kept. */
  async readText(f: Pick<MirrorFile, 'model' | 'version' | 'file' | 'actualSha256'>): Promise<string> {
    const src = await this.openBytes(f);
    try {
      // Both sources know their size (a file stat, a blob stat).
      return (await src.read(0, src.size ?? 0)).toString('utf8');
    } finally {
      await src.close();
    }
  }

  private kindOf(f: MirrorFile): Promise<FileWhat> {
    const bucket = this.bucket();
    if (bucket && f.actualSha256) return readBlobKind(bucket, f.actualSha256, Number(f.bytesDone), f.file);
    return readFileKind(this.paths.file(f.model, f.version, f.file), f.file);
  }

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
   * The version with what each of its files holds: a file verified before kinds were recorded is read from its
   * header now, once, and the answer kept on its row (one that cannot be read stays unknown, to try again).
   */
  async withKinds(mirrored: MirrorVersionView): Promise<MirrorVersionView> {
    if (!mirrored.files.some((f) => f.state === 'PRESENT' && f.kind === null)) return mirrored;
    const files = await Promise.all(
      mirrored.files.map(async (f) => {
        if (f.state !== 'PRESENT' || f.kind !== null) return f;
        const what = await this.kindOf(f);
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
    // The catalog answers, in one statement (catalog-store.ts).
    const rows = await mirrorSourceUses(this.db);
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
