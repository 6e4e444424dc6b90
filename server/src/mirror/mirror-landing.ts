import { randomUUID } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '@hangar/common/log';
import { z } from 'zod';
import type { AuditService } from '../audit/audit.service.js';
import { type Actor, describeActor } from '../auth/actor.js';
import type { Viewer } from '../auth/viewer.js';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import type { LoopHealth } from '../db/outage.js';
import type { MirrorFile } from '../generated/prisma/client.js';
import { ConflictError, fail, ok, type Result, ValidationError } from '../lib/errors.js';
import { parseInput } from '../lib/validate.js';
import { notify } from '../pubsub.js';
import { blobClaimHooks, claimBlob } from './blob-claims.js';
import type { MirrorGround } from './ground.js';
import { type FileWhat, readFileKind } from './kind.js';
import type { MirrorReads } from './mirror-reads.js';
import { type MirrorVersionView, NO_RETRY, nameInput, sha256, versionKey } from './mirror-view.js';
import { discardBucketWrite, readBlobKind } from './on-bucket.js';
import { versionOwner } from './owned.js';
import { fileName, type MirrorPaths } from './paths.js';
import type { MirrorSpace } from './space.js';
import type { MirrorStorage } from './storage.js';
import { blobKey, inOrder, type MirrorStore } from './store/store.js';
import type { TransferDone, TransferFailed } from './transfer.js';

// Bytes arriving in the mirror: a file Hangar made (upload), and a transfer's end (finish): verified bytes moved
// into place, or linked to a copy already held; a failure written down with its reason. The workers
// (mirror-worker.ts) and the operator's fetch (mirror.service.ts) land through it; it drives nothing itself.

/** Who may read what an owner owns (OrgService.mayRead): a copy of an owned file is reused only when it says yes. */
export type MayRead = (viewer: Viewer, owner: string | null) => Promise<boolean>;

export class MirrorLanding {
  private readonly db: Db;
  private readonly audit: AuditService;
  private readonly config: Config;
  private readonly log: Logger;
  private readonly paths: MirrorPaths;
  private readonly storage: MirrorStorage;
  private readonly owner: string;
  private readonly health: LoopHealth;
  private readonly shutdown: AbortSignal;
  private readonly space: MirrorSpace;
  private readonly reads: MirrorReads;
  private readonly mayRead: MayRead | null;

  constructor(
    o: MirrorGround & {
      audit: AuditService;
      reads: MirrorReads;
      /** None, and owned bytes are never reused for anyone. */
      mayRead?: MayRead | null;
    },
  ) {
    this.db = o.db;
    this.audit = o.audit;
    this.config = o.config;
    this.log = o.log;
    this.paths = o.paths;
    this.storage = o.storage;
    this.owner = o.owner;
    this.health = o.health;
    this.shutdown = o.shutdown;
    this.space = o.space;
    this.reads = o.reads;
    this.mayRead = o.mayRead ?? null;
  }

  /**
   * An owned adapter's version takes no files from those its owner does not admit: what they add (an upload, a
   * fetch, a registry set) would be served to the team as its adapter. Refused as a name that is taken, never
   * naming the owner; the refusal is audited here under the owner, so only the one who asked learns that much.
   */
  async refuseOwnedVersion(
    actor: Actor,
    action: string,
    model: string,
    version: string,
  ): Promise<ConflictError | null> {
    const owned = await versionOwner(this.db, model, version);
    if (!owned || (this.mayRead && (await this.mayRead(actor.viewer, owned.owner)))) return null;
    const error = new ConflictError(`the version ${model}/${version} is taken: choose another version name`);
    await this.audit.refused(actor, action, `${model}/${version}`, error.message, owned.owner);
    error.recorded = true;
    return error;
  }

  /**
   * Keeps a file Hangar made (a trained adapter) in the mirror, verified like a fetch: written to a partial,
   * hashed, checked against the digest when one is given, and only then moved into place.
   */
  async upload(
    actor: Actor,
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
    const owned = await this.refuseOwnedVersion(actor, 'uploadToMirror', model, version);
    if (owned) return fail(owned);
    const existing = await this.db.mirrorFile.findUnique({ where: { model_version_file: { model, version, file } } });
    if (existing && existing.state !== 'FAILED' && existing.state !== 'CANCELLED') {
      return fail(
        new ConflictError(
          `${model}/${version}/${file} is already in the mirror (${existing.state.toLowerCase()}): versions are immutable; upload a new version`,
        ),
      );
    }
    const freeBytes = await this.space.freeBytes();
    if (parsed.value.size && parsed.value.size > freeBytes) {
      return fail(
        new ConflictError(
          this.space.shortage(`the upload of ${model}/${version}/${file}`, parsed.value.size, freeBytes, 'upload less'),
        ),
      );
    }
    const row = existing
      ? await this.db.mirrorFile.update({
          where: { id: existing.id },
          data: { state: 'FETCHING', error: null, bytesDone: 0, storageId: this.storage.id },
        })
      : await this.db.mirrorFile.create({
          data: {
            model,
            version,
            file,
            sourceUrl: `upload by ${describeActor(actor)}`,
            state: 'FETCHING',
            storageId: this.storage.id,
            requestedBy: describeActor(actor),
            startedAt: new Date(),
          },
        });
    if (this.storage.bucket) {
      const kept = await this.uploadToBucket(this.storage.bucket, row.id, body, parsed.value);
      if (!kept.ok) return kept;
      await this.recordUpload(actor, row.id, { model, version, file }, kept.value);
      return ok((await this.reads.version(model, version)) as MirrorVersionView);
    }
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
    await this.recordUpload(actor, row.id, { model, version, file }, { size, digest, expected, what });
    return ok((await this.reads.version(model, version)) as MirrorVersionView);
  }

  /**
   * An upload into the bucket (HANGAR_MIRROR_STORE=s3://…): written by the store under its sha256 as it streams,
   * checked against what was announced, and dropped again when it does not match.
   */
  private async uploadToBucket(
    bucket: MirrorStore,
    id: string,
    body: AsyncIterable<Uint8Array>,
    announced: { file: string; sha256?: string | null; size?: number | null },
  ): Promise<Result<{ size: number; digest: string; expected: string | null; what: FileWhat }>> {
    // A failed earlier upload of this row must not be continued: an upload has no Range to resume from.
    await discardBucketWrite(this.db, bucket, id);
    const w = inOrder(await bucket.openWrite(id));
    try {
      for await (const chunk of body) await w.write(chunk);
    } catch (err) {
      const size = w.offset;
      await w.discard().catch(() => {});
      await this.db.mirrorFile.update({
        where: { id },
        data: { state: 'FAILED', error: `the upload broke off after ${size} bytes: ${(err as Error).message}` },
      });
      throw err;
    }
    const done = await w.finish();
    const expected = announced.sha256 ?? null;
    const badSize = announced.size != null && announced.size !== done.size;
    if ((expected && expected !== done.sha256) || badSize) {
      if (!done.held) await bucket.remove(done.sha256);
      const error = badSize
        ? `the upload was ${done.size} bytes; ${announced.size} were announced`
        : `sha256 mismatch: ${expected} was announced, the bytes hash to ${done.sha256}`;
      await this.db.mirrorFile.update({ where: { id }, data: { state: 'FAILED', error, bytesDone: 0 } });
      return fail(new ValidationError('sha256', error));
    }
    // Named under the sha256's lock (blob-claims.ts): bytes the bucket held already may be going with a version
    // removed this moment, and then this upload's own copy is gone too (the bucket kept one).
    if (!(await claimBlob(this.db, bucket, id, done.sha256))) {
      const error =
        'the same bytes were removed with another version while this upload landed, so none are kept: upload it again';
      await this.db.mirrorFile.update({ where: { id }, data: { state: 'FAILED', error, bytesDone: 0 } });
      return fail(new ConflictError(error));
    }
    const what = await readBlobKind(bucket, done.sha256, done.size, announced.file);
    return ok({ size: done.size, digest: done.sha256, expected, what });
  }

  /** An upload's bytes are kept: the row is PRESENT with what they hold, audited in the same transaction. */
  private async recordUpload(
    actor: Actor,
    id: string,
    { model, version, file }: { model: string; version: string; file: string },
    { size, digest, expected, what }: { size: number; digest: string; expected: string | null; what: FileWhat },
  ) {
    await this.db.$transaction(async (tx) => {
      await tx.mirrorFile.update({
        where: { id },
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
      await this.audit.done(tx, actor, {
        action: 'uploadToMirror',
        target: `${model}/${version}/${file}`,
        message: `${size} bytes, sha256 ${digest}`,
        // An owned adapter's files (publishTrainJob): the row is its owner's to see, as the files are.
        owner: (await versionOwner(tx, model, version))?.owner,
      });
      await notify(tx, 'mirrorVersion', versionKey(model, version));
    });
  }

  /**
   * Writes down what the transfer came to. Each write waits out a database outage rather than being dropped: a
   * verified file is recorded PRESENT when the database returns, not downloaded again. 'requeued' when the held
   * copy it was to be linked to went meanwhile: the file is QUEUED again, and the caller looks for work now.
   */
  async finish(
    row: MirrorFile,
    result: TransferDone | TransferFailed,
    /**
     * The held copy to link, already looked up: the one chosen for the requester (fetch), or the one the worker's
     * attempt found just before (not looked up a second time). Gone meanwhile, the file is fetched after all.
     */
    pinned?: { path: string; size: number },
  ): Promise<'requeued' | undefined> {
    const key = versionKey(row.model, row.version);
    const partial = this.paths.partial(row.id);
    const write = <T>(fn: () => Promise<T>) => this.health.until(fn, () => this.shutdown.aborted);
    // Best effort: when the database is away, so is every listener, and a client that reconnects reads afresh.
    const tell = () => notify(this.db.loops, 'mirrorVersion', key).catch(() => {});

    const whileOurs = { id: row.id, leaseOwner: this.owner };
    if (!result.ok) {
      if (result.reason === 'cancelled') {
        if (this.shutdown.aborted) {
          // A shutdown, not a cancel: back in the queue, to resume from the partial at the next start.
          await this.db.loops.mirrorFile
            .updateMany({
              where: { ...whileOurs, state: 'FETCHING' },
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
          const now = await this.db.loops.mirrorFile.findUnique({ where: { id: row.id } }).catch(() => undefined);
          if (now === null || now?.state === 'CANCELLED') {
            await fs.rm(partial, { force: true });
            if (this.storage.bucket)
              await discardBucketWrite(this.db, this.storage.bucket, row.id).catch((err) =>
                this.log.warn("could not discard a cancelled download's upload in the bucket", {
                  id: row.id,
                  error: err,
                }),
              );
          } else if (now?.state === 'PAUSED' && !this.storage.bucket) {
            const kept = await fs.stat(partial).then(
              (st) => st.size,
              () => 0,
            );
            await this.db.loops.mirrorFile
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
        this.db.loops.mirrorFile.updateMany({
          where: { ...whileOurs, state: 'FETCHING' },
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
      // Only a download fails (the mirror loop's work): its line names the loop and the file, never a request.
      this.log.warn('mirror file failed', {
        loop: 'mirror',
        fileId: row.id,
        file: `${row.model}/${row.version}/${row.file}`,
        reason: result.reason,
      });
      await tell();
      return;
    }

    // The same bytes once: a file whose sha256 the mirror already holds, verified, becomes a hard link to it,
    // whether that was known before the download (held) or only once its bytes were hashed.
    const copy = pinned ?? (await this.heldCopy(result.sha256, row.id));
    if (result.held && !copy) {
      // The copy went (removed) between the look and now: download the file after all.
      await write(() =>
        this.db.loops.mirrorFile.updateMany({
          where: { ...whileOurs, state: 'FETCHING' },
          data: { state: 'QUEUED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null, ...NO_RETRY },
        }),
      );
      return 'requeued';
    }
    const size = result.held && copy ? copy.size : result.size;
    const { count: stillMine } = await write(() =>
      this.db.loops.mirrorFile.updateMany({
        where: { ...whileOurs, state: 'FETCHING' },
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
        this.db.loops.mirrorFile.updateMany({
          where: whileOurs,
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
    const bucket = this.storage.bucket;
    // In a bucket the row names the blob by its sha256: there is nothing to move or link. It names it under the
    // sha256's lock, and only while the blob is there (blob-claims.ts): a removal of another version with these
    // bytes that deleted the blob first leaves this file to be fetched again, never PRESENT with no bytes. On
    // disk the held copy is linked, and one removed with its version meanwhile does the same.
    if (!bucket && copy) await blobClaimHooks.beforeLink?.(result.sha256);
    const landed = bucket
      ? await write(() => claimBlob(this.db.loops, bucket, row.id, result.sha256))
      : await this.promote(row, partial, copy?.path, result.held === true);
    if (!landed) {
      this.log.warn('the bytes this file counted on were removed with another version meanwhile: fetching it again', {
        file: `${row.model}/${row.version}/${row.file}`,
        sha256: result.sha256,
      });
      await fs.rm(partial, { force: true });
      await write(() =>
        this.db.loops.mirrorFile.updateMany({
          where: whileOurs,
          data: {
            state: 'QUEUED',
            leaseOwner: null,
            leaseUntil: null,
            bytesDone: 0,
            bytesPerSecond: null,
            ...NO_RETRY,
          },
        }),
      );
      await tell();
      return 'requeued';
    }
    if (copy)
      this.log.info('the mirror already held these bytes: linked, not stored twice', {
        file: `${row.model}/${row.version}/${row.file}`,
        sha256: result.sha256,
        from: copy.path,
        downloaded: !result.held,
      });
    const what = bucket
      ? await readBlobKind(bucket, result.sha256, size, row.file)
      : await readFileKind(this.paths.file(row.model, row.version, row.file), row.file);
    await write(() =>
      this.db.loops.mirrorFile.updateMany({
        where: whileOurs,
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
   * its verified size and that a new file may be linked to: one in a version nobody owns, or, for a `reader` its
   * owner admits (OrgService.mayRead), one in an owned version. A sha256 is no credential (a team adapter's is
   * shown wherever the adapter is), so reuse never crosses an owner: the queue's workers act for no reader, and
   * link only bytes nobody owns; a file whose only copies are owned is fetched from its URL like any other.
   */
  async heldCopy(
    sha: string,
    except: string | null,
    reader?: Viewer,
  ): Promise<{ path: string; size: number; owned: boolean } | null> {
    const rows = await this.db.loops.mirrorFile.findMany({
      where: {
        actualSha256: sha,
        expectedSha256: sha,
        state: 'PRESENT',
        storageId: this.storage.id,
        ...(except ? { id: { not: except } } : {}),
      },
      orderBy: { finishedAt: 'asc' },
      take: 20,
    });
    for (const r of rows) {
      const owned = await versionOwner(this.db.loops, r.model, r.version);
      if (owned && !(reader && this.mayRead && (await this.mayRead(reader, owned.owner)))) continue;
      const bucket = this.storage.bucket;
      const file = bucket ? `${bucket.where}/${blobKey(sha)}` : this.paths.file(r.model, r.version, r.file);
      const size = bucket
        ? await bucket.stat(sha).then(
            (st) => st?.size ?? null,
            () => null,
          )
        : await fs.stat(file).then(
            (st) => st.size,
            () => null,
          );
      if (size !== null && (r.bytesTotal === null || BigInt(size) === r.bytesTotal))
        return { path: file, size, owned: owned !== null };
    }
    return null;
  }

  /**
   * Only a verified file is moved to where it is listed and served; rename is atomic on one filesystem. With a
   * `copy` of the same bytes, the listed file is a hard link to it instead: one set of blocks on the disk, freed
   * by the filesystem only once no version links them any more.
   */
  /**
   * False when the held copy it was to be linked to is gone (removed with its version meanwhile) and it has no
   * bytes of its own (`held`): nothing was put in place, and the file must be fetched after all.
   */
  private async promote(
    row: Pick<MirrorFile, 'model' | 'version' | 'file'>,
    partial: string,
    copy?: string,
    held = false,
  ): Promise<boolean> {
    const target = this.paths.file(row.model, row.version, row.file);
    await fs.mkdir(path.dirname(target), { recursive: true });
    if (copy) {
      // Linked beside the target, then renamed over it: a file refetched with force is replaced in one step.
      const tmp = path.join(this.paths.partials, `${randomUUID()}.link`);
      let gone = false;
      const linked = await fs.link(copy, tmp).then(
        () => true,
        (err: NodeJS.ErrnoException) => {
          gone = err.code === 'ENOENT';
          if (gone && held) return false; // said by the caller: the file is fetched again
          // A filesystem without hard links (or the copy on another one): stored twice, but stored.
          this.log.warn('could not hard-link a file the mirror already holds; keeping its own bytes', {
            file: target,
            error: err.code ?? err.message,
          });
          return false;
        },
      );
      // With no bytes of its own, what the partial holds is nothing (an emptied part), never the file.
      if (!linked && held && gone) return false;
      if (linked) {
        await fs.rename(tmp, target);
        await fs.rm(partial, { force: true });
      } else if (
        !held &&
        (await fs.stat(partial).then(
          () => true,
          () => false,
        ))
      )
        await fs.rename(partial, target);
      else {
        const copied = await fs.copyFile(copy, target).then(
          () => true,
          (err: NodeJS.ErrnoException) => {
            if (err.code === 'ENOENT' && held) return false;
            throw err;
          },
        );
        if (!copied) return false;
      }
    } else await fs.rename(partial, target);
    if (!this.config.mirrorFsync) return true;
    // The rename is on the disk too, not only the bytes (transfer flushed them): then a file marked PRESENT is
    // there after the machine restarts.
    const dir = await fs.open(path.dirname(target), 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
    return true;
  }
}
