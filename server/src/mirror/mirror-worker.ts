import fs from 'node:fs/promises';
import { type Logger, withFields } from '@hangar/common/log';
import { hubAuthorization, type OutboundPolicy } from '@hangar/common/outbound';
import { waitUntil } from '@hangar/common/retry';
import type { Config } from '../config.js';
import type { Db } from '../db/client.js';
import { LeaseQueue } from '../db/lease.js';
import { type LoopHealth, Stopped } from '../db/outage.js';
import { type MirrorFile, Prisma } from '../generated/prisma/client.js';
import { notify } from '../pubsub.js';
import { removeUnclaimedBlob } from './blob-claims.js';
import type { MirrorGround } from './ground.js';
import type { MirrorLanding } from './mirror-landing.js';
import { isHubUrl, NO_RETRY, versionKey } from './mirror-view.js';
import { fetchToBucket } from './on-bucket.js';
import type { MirrorPaths } from './paths.js';
import type { MirrorSpace } from './space.js';
import type { MirrorStorage } from './storage.js';
import type { RetryState, TransferDone, TransferFailed, TransferOptions, transfer } from './transfer.js';

// The mirror's workers: the queue of files in PostgreSQL, each taken by one replica under a lease
// (db/lease.ts), transferred with resumable Range requests (transfer.ts) and landed (mirror-landing.ts). Given
// each of those, rather than sharing their state: what the pool owns is its transfers and its poll.

/** A file is held by one replica at a time; one whose replica went away is taken up 30 s after its last renewal. */
export const fileLeases = new LeaseQueue({ table: 'MirrorFile', leaseMs: 30_000, touchColumn: 'updatedAt' });
const PERSIST_MS = 1000;
/**
 * How often a replica looks for work it was not told of: another replica's queue, an expired lease. Its own is
 * claimed when it is queued (kick). A setting only for tests, which make it long to show that nothing waits on it.
 */
export const mirrorPoll = { ms: 2000 };

/** The verified copy an attempt found of the bytes it was to fetch: finish links it rather than looking again. */
type HeldCopy = { copy: { path: string; size: number } | null };

export class MirrorWorkers {
  private readonly db: Db;
  private readonly config: Config;
  private readonly log: Logger;
  private readonly paths: MirrorPaths;
  private readonly storage: MirrorStorage;
  private readonly owner: string;
  private readonly health: LoopHealth;
  private readonly shutdown: AbortSignal;
  private readonly space: MirrorSpace;
  private readonly landing: MirrorLanding;
  private readonly leases: LeaseQueue;
  private readonly transfer: typeof transfer;
  private readonly outbound: OutboundPolicy;
  private readonly throttle: NonNullable<TransferOptions['throttle']>;
  /** This process's running transfers, by file id: never claimed twice, and stopped by cancel, pause, remove. */
  private readonly transfers = new Map<string, AbortController>();
  private poll: NodeJS.Timeout | undefined;
  private running = false;
  private ticking = false;
  /** A kick that came while a tick was claiming: that tick may have looked before the new work was there. */
  private kickedMeanwhile = false;

  constructor(
    o: MirrorGround & {
      landing: MirrorLanding;
      leases: LeaseQueue;
      transfer: typeof transfer;
      /** Which hosts and addresses a transfer may connect to (HANGAR_FETCH_ALLOW), at each connection. */
      outbound: OutboundPolicy;
      /** HANGAR_MIRROR_BANDWIDTH, shared by every download of this process. */
      throttle: NonNullable<TransferOptions['throttle']>;
    },
  ) {
    this.db = o.db;
    this.config = o.config;
    // Its lines are the mirror loop's, each transfer's with its file's id, not the request's whose fetch woke it.
    this.log = withFields(o.log, { loop: 'mirror' });
    this.paths = o.paths;
    this.storage = o.storage;
    this.owner = o.owner;
    this.health = o.health;
    this.shutdown = o.shutdown;
    this.space = o.space;
    this.landing = o.landing;
    this.leases = o.leases;
    this.transfer = o.transfer;
    this.outbound = o.outbound;
    this.throttle = o.throttle;
  }

  /** Picks up what a previous run left: unfinished files resume from their partials; vanished files are failed. */
  async start(embedded: boolean) {
    if (!this.storage.id) await this.storage.open();
    const bucket = this.storage.bucket;
    if (!bucket) await fs.mkdir(this.paths.partials, { recursive: true });
    if (embedded) {
      // The embedded database is this process's alone, so any lease in it is from a run that has ended.
      await this.db.mirrorFile.updateMany({
        where: { state: { in: ['FETCHING', 'VERIFYING'] } },
        data: { state: 'QUEUED', leaseOwner: null, leaseUntil: null, bytesPerSecond: null },
      });
    }
    // Only this storage's files: another's are not this replica's to judge (MirrorStorage.open refuses to start then).
    for (const r of await this.db.mirrorFile.findMany({ where: { state: 'PRESENT', storageId: this.storage.id } })) {
      // A file deleted by hand, or cut short by a crash of the machine before the disk had it all (what ext4 and
      // XFS leave of bytes that were only in memory), must not go on looking ready.
      const size = bucket
        ? await bucket.stat(r.actualSha256 ?? '').then(
            (st) => st?.size ?? null,
            () => null,
          )
        : await fs.stat(this.paths.file(r.model, r.version, r.file)).then(
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
        where: { id: r.id, state: 'PRESENT', storageId: this.storage.id },
        data: { state: 'FAILED', error, bytesDone: 0 },
      });
      await notify(this.db, 'mirrorVersion', versionKey(r.model, r.version));
    }
    this.running = true;
    // Other replicas' queues and expired leases are noticed by polling; this process's own work by kick().
    this.poll = setInterval(() => this.kick(), mirrorPoll.ms);
    this.kick();
  }

  /** Stops claiming and aborts this process's transfers; the service has aborted `shutdown` first (finish). */
  async stop() {
    this.running = false;
    clearInterval(this.poll);
    for (const c of this.transfers.values()) c.abort();
    await waitUntil(() => this.transfers.size === 0, { timeoutMs: 5000, pollMs: 20 });
  }

  /** Stops this process's transfer of a file (cancelled, paused or removed): finish keeps or drops its partial. */
  abort(id: string) {
    this.transfers.get(id)?.abort();
  }

  kick() {
    // While the database is away the poll still ticks, but tries again only after a backoff.
    if (!this.running || !this.health.due()) return;
    // Not dropped: the tick under way may have looked for work before this kick's work was committed, and
    // then the work would wait for the next poll. It looks again once it ends.
    if (this.ticking) {
      this.kickedMeanwhile = true;
      return;
    }
    this.ticking = true;
    this.kickedMeanwhile = false;
    // The claims, the transfers they start and the progress those persist are all on the loops' connections
    // (db.loops): a busy console must not stall a download's lease renewals.
    void this.fill()
      .catch((err) => {
        if (err instanceof Stopped || this.health.failed(err)) return;
        this.log.error('mirror worker could not claim work', { error: err });
      })
      .finally(() => {
        this.ticking = false;
        if (this.kickedMeanwhile) this.kick();
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
          this.space.release(row.id);
          this.kick();
        });
    }
  }

  /** Takes the next file with a lease, atomically: with several replicas, exactly one works on each file. */
  private async claim(): Promise<MirrorFile | null> {
    // Never a file this process is still working on, however late its lease: a second transfer would append to
    // the same partial.
    const running = [...this.transfers.keys()];
    // An upload is FETCHING with no lease at all: only a lease that ran out makes a file another worker's to take.
    // The whole row comes back with the claim: one round trip, and no moment when the file is claimed but not
    // yet read (an outage there would leave a lease nobody works under until it ran out).
    const row = await this.leases.claim<MirrorFile>(this.db.loops, this.owner, {
      claimable: Prisma.sql`(state = 'QUEUED' OR (state IN ('FETCHING', 'VERIFYING') AND ${this.leases.expired()}))
          AND NOT (id = ANY(${running}::uuid[]))
          -- A partial on storage this replica cannot see is not its to resume.
          AND ("storageId" IS NULL OR "storageId" = ${this.storage.id})`,
      order: Prisma.sql`"createdAt", file`,
      set: Prisma.sql`state = 'FETCHING', "storageId" = ${this.storage.id}, attempts = attempts + 1,
        "retryAttempt" = NULL, "retryAt" = NULL, "retryReason" = NULL, "startedAt" = coalesce("startedAt", now())`,
      returning: Prisma.sql`*`,
    });
    if (!row) return null;
    // Told without waiting for it: the transfer starts meanwhile. Best effort, as every listener reads afresh.
    void notify(this.db.loops, 'mirrorVersion', versionKey(row.model, row.version)).catch(() => {});
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
        const held: HeldCopy = { copy: null };
        const outcome = await this.attempt(row, controller, held);
        if (outcome !== 'paused') {
          // Linked to the copy this attempt found, not looked up again; one that went meanwhile queues the file
          // again, for a worker to fetch after all.
          const copy = outcome.ok && outcome.held ? (held.copy ?? undefined) : undefined;
          if ((await this.landing.finish(row, outcome, copy)) === 'requeued') this.kick();
          return;
        }
        const stillOurs = await this.health.until(
          () => this.leases.renew(this.db.loops, row.id, this.owner, Prisma.sql`state = 'FETCHING'`),
          () => this.shutdown.aborted,
        );
        // Cancelled, removed or taken over by another replica while the database was away: no longer ours.
        if (!stillOurs) return;
        row = await this.health.until(
          () => this.db.loops.mirrorFile.findUniqueOrThrow({ where: { id: row.id } }),
          () => this.shutdown.aborted,
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
    held: HeldCopy,
  ): Promise<TransferDone | TransferFailed | 'paused'> {
    // Asked for by its sha256 and already held: not a byte is fetched (finish links it). Not from the Hub: /hf
    // lists the file as the repository's, so the Hub must answer for it; its headers publish the sha256, and a
    // held copy is linked once they say so, before the body (transfer's alreadyHeld).
    const copy =
      row.expectedSha256 && !isHubUrl(this.config.hubUrl, row.sourceUrl)
        ? await this.landing.heldCopy(row.expectedSha256, row.id)
        : null;
    held.copy = copy;
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
            data: { ...data, leaseUntil: this.leases.deadline(this.db.loops.clock.now()) },
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
      this.leases
        .renew(this.db.loops, row.id, this.owner, Prisma.sql`state = 'FETCHING'`)
        .then((stillOurs) => !stillOurs && abortLocal(), writeFailed);
    }, this.leases.leaseMs / 3);
    const bucket = this.storage.bucket;
    const result = await (bucket
      ? // The disk's rules with the bucket's write as the sink (fetch-into-store.ts): the same settings as below.
        fetchToBucket({
          store: bucket,
          id: row.id,
          url: row.sourceUrl,
          expectedSha256: row.expectedSha256,
          expectedSize: row.bytesTotal === null ? null : Number(row.bytesTotal),
          etag: row.etag,
          headers: hubAuthorization(row.sourceUrl, this.config),
          guard: this.outbound,
          stallMs: this.config.mirrorStallSeconds * 1000,
          maxAttempts: this.config.mirrorAttempts,
          giveUpAfterMs: this.config.mirrorGiveUpAfterMs,
          retryMaxMs: this.config.mirrorRetryMaxMs,
          onRetry,
          throttle: this.throttle,
          alreadyHeld: async (sha) => {
            held.copy = await this.landing.heldCopy(sha, row.id);
            return held.copy !== null;
          },
          removeBlob: (sha) => removeUnclaimedBlob(this.db.loops, bucket, sha).then(() => {}),
          signal,
          onProgress: (bytesDone, bytesTotal, etag) => {
            if (bytesTotal !== null) this.space.landed(row.id, bytesTotal - bytesDone);
            persist({ bytesDone, bytesTotal, etag });
          },
          // HANGAR_S3_QUOTA, also for a file whose size only its upstream's answer tells.
          reserveSpace: (bytes) => this.space.reserve(row.id, `${row.model}/${row.version}/${row.file}`, bytes),
          log: (msg, fields) => this.log.info(msg, { ...fields, file: `${row.model}/${row.version}/${row.file}` }),
        })
      : this.transferToDisk(row, signal, partial, persist, onRetry, held)
    ).finally(() => {
      clearInterval(heartbeat);
      clearInterval(quiet);
    });
    await persisting;
    if (paused && !result.ok && result.reason === 'cancelled') return 'paused';
    return result;
  }

  /** Today's transfer into the partial under the data dir (`file`), with the mirror's bandwidth, stall and retry. */
  private transferToDisk(
    row: MirrorFile,
    signal: AbortSignal,
    partial: string,
    persist: (progress: { bytesDone: number; bytesTotal: number | null; etag: string | null }) => void,
    onRetry: (retry: RetryState | null) => void,
    held: HeldCopy,
  ) {
    return this.transfer({
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
      throttle: this.throttle,
      alreadyHeld: async (sha) => {
        held.copy = await this.landing.heldCopy(sha, row.id);
        return held.copy !== null;
      },
      fsync: this.config.mirrorFsync,
      signal,
      onProgress: (progress) => {
        if (progress.bytesTotal !== null) this.space.landed(row.id, progress.bytesTotal - progress.bytesDone);
        persist(progress);
      },
      reserveSpace: (bytes) => this.space.reserve(row.id, `${row.model}/${row.version}/${row.file}`, bytes),
      log: (msg, fields) => this.log.info(msg, { ...fields, file: `${row.model}/${row.version}/${row.file}` }),
    });
  }
}
