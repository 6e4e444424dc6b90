import type { Db } from '../db/client.js';
import { ACTIVE } from './mirror-view.js';
import type { MirrorPaths } from './paths.js';

// Room on the mirror's disk: what a new fetch or upload really has, and what each of this process's running
// downloads has been promised. One per service: the fetch check and the workers' reservations must count the
// same bytes, or two downloads asking at once both take the same free space.

export class MirrorSpace {
  private readonly db: Db;
  private readonly paths: MirrorPaths;
  private readonly owner: string;
  private readonly diskFree: () => Promise<number>;
  /** What each of this process's running downloads still needs of the disk, by file id (reserve). */
  private readonly reserved = new Map<string, number>();

  constructor(o: {
    db: Db;
    paths: MirrorPaths;
    /** This process's lease owner: its own running downloads are counted from memory, not from their rows. */
    owner: string;
    /** Free bytes on the mirror's filesystem (MirrorService.diskFree: tests replace it with a disk of a size). */
    diskFree: () => Promise<number>;
    /**
     * On a bucket with HANGAR_S3_QUOTA, how a refusal names the room (bucket-space.ts's quotaWhere); null on the
     * disk, where it is the free space under the mirror's root.
     */
    quotaWhere?: () => string | null;
  }) {
    this.db = o.db;
    this.paths = o.paths;
    this.owner = o.owner;
    this.diskFree = o.diskFree;
    this.quotaWhere = o.quotaWhere ?? (() => null);
  }

  private readonly quotaWhere: () => string | null;

  /**
   * A refusal for `needed` bytes when `free` are left: on the disk, free space under the mirror's root; on a bucket,
   * what HANGAR_S3_QUOTA leaves, naming the setting, so the operator knows which of the two to raise.
   */
  shortage(what: string, needed: number, free: number, remedy: string): string {
    const quota = this.quotaWhere();
    return quota
      ? `not enough room in the bucket for ${what}: it needs ${needed} bytes and ${free} are left ${quota} (after what the downloads under way still need); raise HANGAR_S3_QUOTA, remove versions no model uses, or ${remedy}`
      : `not enough disk for ${what}: it needs ${needed} bytes and ${free} are free under ${this.paths.root} (after what the downloads under way still need); free space, or ${remedy}`;
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
  private async stillNeeded(filter: { states?: readonly string[]; notOwner?: string } = {}, db: Db = this.db) {
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
  async reserve(id: string, file: string, bytes: number): Promise<string | null> {
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
      const quota = this.quotaWhere();
      return (
        `${quota ? 'not enough room in the bucket' : 'not enough disk'}: ${file} has ${bytes} bytes still to come and ${Math.max(0, room)} are ${quota ? `left ${quota}` : `free under ${this.paths.root}`}` +
        (promised ? ` once the ${promised} bytes that other running downloads still need are set aside` : '') +
        `; ${quota ? 'raise HANGAR_S3_QUOTA or remove versions no model uses' : 'free space'} (or let the others finish) and retry: the partial is kept`
      );
    }
    this.reserved.set(id, bytes);
    return null;
  }

  /** What is reserved shrinks as the bytes land: from then on the disk's free space counts them. */
  landed(id: string, stillToCome: number) {
    if (this.reserved.has(id)) this.reserved.set(id, Math.max(0, stillToCome));
  }

  /** The download ended, however: its room is no longer held. */
  release(id: string) {
    this.reserved.delete(id);
  }
}
