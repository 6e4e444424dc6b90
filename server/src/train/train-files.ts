import { createReadStream } from 'node:fs';
import fs from 'node:fs/promises';
import type { Readable } from 'node:stream';
import type { Db } from '../db/client.js';
import { removeUnclaimedBlob } from '../mirror/blob-claims.js';
import type { MirrorService } from '../mirror/mirror.service.js';
import { putBlob } from '../mirror/store/put-blob.js';
import { blobHeldByTraining } from './train-store.js';

// Where training's files are kept: the pairs (by their sha256) and what a job made (the PEFT tar, the GGUF
// adapter). On a `file` mirror, files under HANGAR_DATA_DIR/train as before. With the mirror in a bucket
// (HANGAR_MIRROR_STORE=s3://…) they go into the same bucket, content-addressed beside the mirror's blobs, so
// every server replica serves them however its own data dir is set: the replica a node uploaded to, one that
// publishes the adapter later, one a browser downloads from. What must be read as a file (a PEFT tar to unpack,
// the adapter's header while publishing) is read from the replica's verified local copy (store/local-copy.ts).

/** An artifact row as far as its bytes go. */
type Kept = { sha256: string; path: string };

export class TrainFiles {
  private readonly db: Db;
  private readonly mirror: MirrorService;

  constructor(deps: { db: Db; mirror: MirrorService }) {
    this.db = deps.db;
    this.mirror = deps.mirror;
  }

  /** Whether the files are in the mirror's bucket rather than under the data dir. */
  get inBucket(): boolean {
    return this.mirror.bucket !== null;
  }

  // ─── the pairs ─────────────────────────────────────────────────────────────

  /** Keeps the pairs in the bucket under their sha256 (once: the same pairs again write nothing). */
  async keepData(data: string, sha256: string) {
    const bucket = this.mirror.bucket;
    if (!bucket) throw new Error('keepData on a bucket is called only where the mirror is in one');
    await putBlob(bucket, sha256, [Buffer.from(data, 'utf8')]);
  }

  /** Kept pairs as text, or null when none are kept under this sha256 (here: the data dir's `file`). */
  async dataText(sha256: string, file: string): Promise<string | null> {
    const bucket = this.mirror.bucket;
    if (!bucket) return fs.readFile(file, 'utf8').catch(() => null);
    if (!(await this.inBucketNow(sha256, file))) return null;
    const chunks: Buffer[] = [];
    for await (const c of await bucket.read(sha256)) chunks.push(Buffer.from(c));
    return Buffer.concat(chunks).toString('utf8');
  }

  /** A job's pairs, streamed to its node or an operator. */
  async dataStream(job: { dataSha256: string; dataPath: string }): Promise<Readable> {
    const bucket = this.mirror.bucket;
    if (!bucket) return createReadStream(job.dataPath);
    await this.inBucketNow(job.dataSha256, job.dataPath);
    return bucket.read(job.dataSha256);
  }

  /** Pairs no job names any more: their file, or their blob unless the mirror or training still holds the bytes. */
  async forgetData(sha256: string, file: string) {
    const bucket = this.mirror.bucket;
    if (!bucket) return fs.rm(file, { force: true });
    await this.forgetBlob(sha256);
  }

  // ─── what a job made ───────────────────────────────────────────────────────

  /**
   * An artifact the server has just written and hashed at `file`: on a bucket it goes in under its sha256, and
   * the file becomes this replica's local copy of it. Answers the path to record (the file's, on `file`).
   */
  async keepArtifact(file: string, sha256: string): Promise<string> {
    const bucket = this.mirror.bucket;
    const copies = this.mirror.localCopies;
    if (!bucket || !copies) return file;
    await putBlob(bucket, sha256, createReadStream(file));
    return copies.adopt(sha256, file);
  }

  /** An artifact's bytes, for a download. */
  async artifactStream(a: Kept): Promise<Readable> {
    const bucket = this.mirror.bucket;
    if (!bucket) return createReadStream(a.path);
    await this.inBucketNow(a.sha256, a.path);
    return bucket.read(a.sha256);
  }

  /** An artifact as a file to read: its own on `file`, this replica's verified copy of its blob on a bucket. */
  async artifactFile(a: Kept): Promise<string> {
    const copies = this.mirror.localCopies;
    if (!copies) return a.path;
    await this.inBucketNow(a.sha256, a.path);
    return copies.copy(a.sha256);
  }

  /** A deleted job's artifacts on a bucket: each blob goes unless another job or the mirror holds its bytes. */
  async forgetArtifacts(arts: readonly Kept[]) {
    if (!this.mirror.bucket) return;
    for (const a of arts) await this.forgetBlob(a.sha256);
  }

  /**
   * Whether the bucket holds the blob, putting it in first from `file` when this replica still has it there: pairs
   * and artifacts kept under the data dir before the mirror moved into the bucket (`hangar mirror migrate` moves
   * the mirror's files, not training's) go in at their first read, and are every replica's from then on.
   */
  private async inBucketNow(sha256: string, file: string): Promise<boolean> {
    const bucket = this.mirror.bucket;
    if (!bucket) return false;
    if (await bucket.stat(sha256)) return true;
    const there = await fs.stat(file).then(
      (st) => st.isFile(),
      () => false,
    );
    if (!there) return false;
    await putBlob(bucket, sha256, createReadStream(file));
    return true;
  }

  private async forgetBlob(sha256: string) {
    const bucket = this.mirror.bucket;
    if (!bucket) return;
    // This replica's copy goes in any case (it is a cache; others' stay until their data dir is cleaned); the
    // blob in the bucket only when no job and no mirror version names its bytes.
    await this.mirror.localCopies?.forget(sha256);
    if (await blobHeldByTraining(this.db, sha256)) return;
    // Under the mirror's lock on the sha256 (mirror/blob-claims.ts): kept when a mirror version names the bytes.
    await removeUnclaimedBlob(this.db, bucket, sha256);
  }
}
