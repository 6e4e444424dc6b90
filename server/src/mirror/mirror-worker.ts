import fs from 'node:fs/promises';
import path from 'node:path';
import { hubAuthorization } from '@hangar/common/outbound';
import { LeaseQueue } from '../db/lease.js';
import { Stopped } from '../db/outage.js';
import { type MirrorFile, Prisma } from '../generated/prisma/client.js';
import { notify } from '../pubsub.js';
import { MirrorLanding } from './mirror-landing.js';
import { NO_RETRY, versionKey } from './mirror-view.js';
import { createStorageId, holdsAnything, MirrorStorageError, readStorageId } from './storage.js';
import { type RetryState, type TransferDone, type TransferFailed, transfer } from './transfer.js';

// The mirror's workers: the queue of files in PostgreSQL, each taken by one replica under a lease
// (db/lease.ts), transferred with resumable Range requests (transfer.ts) and landed (mirror-landing.ts).

/** A file is held by one replica at a time; one whose replica went away is taken up 30 s after its last renewal. */
export const fileLeases = new LeaseQueue({ table: 'MirrorFile', leaseMs: 30_000, touchColumn: 'updatedAt' });
const PERSIST_MS = 1000;

export abstract class MirrorWorkers extends MirrorLanding {
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
          const onThisOne = recorded.find((r) => r.id === id);
          throw new MirrorStorageError(
            `this replica's mirror storage is ${id} at ${where}, but the database's mirror holds files on storage ${listed(others)}${onThisOne ? ` (and ${onThisOne.files} on this one)` : ''}, which this replica cannot see. ` +
              `Replicas that share a database share one mirror storage: start this one with HANGAR_DATA_DIR on that shared filesystem (its ${path.basename(idFile)} reads ${others.map((o) => o.id).join(' or ')}). Nothing was changed.${onThisOne || others.length > 1 ? '' : ` ${gone(others[0]?.id as string)}`}`,
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
    // The claims, the transfers they start and the progress those persist are all on the loops' connections
    // (db.loops): a busy console must not stall a download's lease renewals.
    void this.fill()
      .catch((err) => {
        if (err instanceof Stopped || this.health.failed(err)) return;
        this.log.error('mirror worker could not claim work', { error: err });
      })
      .finally(() => {
        this.ticking = false;
      });
  }

  protected async fill() {
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
  protected async claim(): Promise<MirrorFile | null> {
    // Never a file this process is still working on, however late its lease: a second transfer would append to
    // the same partial.
    const running = [...this.transfers.keys()];
    // An upload is FETCHING with no lease at all: only a lease that ran out makes a file another worker's to take.
    const claimed = await fileLeases.claim(this.db.loops, this.owner, {
      claimable: Prisma.sql`(state = 'QUEUED' OR (state IN ('FETCHING', 'VERIFYING') AND ${fileLeases.expired()}))
          AND NOT (id = ANY(${running}::uuid[]))
          -- A partial on storage this replica cannot see is not its to resume.
          AND ("storageId" IS NULL OR "storageId" = ${this.storageId})`,
      order: Prisma.sql`"createdAt", file`,
      set: Prisma.sql`state = 'FETCHING', "storageId" = ${this.storageId}, attempts = attempts + 1,
        "retryAttempt" = NULL, "retryAt" = NULL, "retryReason" = NULL, "startedAt" = coalesce("startedAt", now())`,
    });
    if (!claimed) return null;
    const id = claimed.id;
    // Claimed now: an outage from here on must not lose the file to a lease that nobody works under.
    const row = await this.health.until(
      () => this.db.loops.mirrorFile.findUniqueOrThrow({ where: { id } }),
      () => !this.running,
    );
    await notify(this.db.loops, 'mirrorVersion', versionKey(row.model, row.version)).catch(() => {});
    return row;
  }

  /**
   * One file, from its claim to PRESENT or FAILED. When the database goes away under a transfer, the transfer
   * stops: this replica can neither record progress nor renew its lease, and with the lease lapsing another
   * replica could take the file over. The bytes stay in the partial; once the database answers, this worker takes
   * its lease up again and resumes with a Range request from where the partial ends.
   */
  protected async run(claimed: MirrorFile, first: AbortController) {
    let row = claimed;
    let controller = first;
    try {
      for (;;) {
        const outcome = await this.attempt(row, controller);
        if (outcome !== 'paused') return await this.finish(row, outcome);
        const stillOurs = await this.health.until(
          () => fileLeases.renew(this.db.loops, row.id, this.owner, Prisma.sql`state = 'FETCHING'`),
          () => this.stopping,
        );
        // Cancelled, removed or taken over by another replica while the database was away: no longer ours.
        if (!stillOurs) return;
        row = await this.health.until(
          () => this.db.loops.mirrorFile.findUniqueOrThrow({ where: { id: row.id } }),
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
  protected async attempt(
    row: MirrorFile,
    controller: AbortController,
  ): Promise<TransferDone | TransferFailed | 'paused'> {
    // Asked for by its sha256 and already held: not a byte is fetched (finish links it). Not from the Hub: /hf
    // lists the file as the repository's, so the Hub must answer for it; its headers publish the sha256, and a
    // held copy is linked once they say so, before the body (transfer's alreadyHeld).
    const copy =
      row.expectedSha256 && !this.isHubUrl(row.sourceUrl) ? await this.heldCopy(row.expectedSha256, row.id) : null;
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
          const { count } = await this.db.loops.mirrorFile.updateMany({
            where: { id: row.id, state: 'FETCHING', leaseOwner: this.owner },
            data: { ...data, leaseUntil: fileLeases.deadline(this.db.loops.clock.now()) },
          });
          this.health.ok();
          if (count === 0) abortLocal();
          else await notify(this.db.loops, 'mirrorVersion', key);
        })
        .catch(writeFailed);
    };
    let lastByteAt = Date.now();
    const persist = (progress: { bytesDone: number; bytesTotal: number | null; etag: string | null }) => {
      const now = Date.now();
      if (progress.bytesDone !== lastBytes) lastByteAt = now;
      if (paused || now - lastPersist < PERSIST_MS) return;
      const instant = ((progress.bytesDone - lastBytes) * 1000) / (now - lastPersist);
      rate = rate === null ? instant : rate * 0.7 + instant * 0.3; // smoothed, so the ETA does not jump about
      lastPersist = now;
      lastBytes = progress.bytesDone;
      record({
        bytesDone: progress.bytesDone,
        bytesTotal: progress.bytesTotal ?? undefined,
        etag: progress.etag,
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
      fileLeases
        .renew(this.db.loops, row.id, this.owner, Prisma.sql`state = 'FETCHING'`)
        .then((stillOurs) => !stillOurs && abortLocal(), writeFailed);
    }, fileLeases.leaseMs / 3);
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
      onProgress: (progress) => {
        // What is reserved shrinks as the bytes land: from then on the disk's free space counts them.
        if (progress.bytesTotal !== null && this.reserved.has(row.id))
          this.reserved.set(row.id, Math.max(0, progress.bytesTotal - progress.bytesDone));
        persist(progress);
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
}
